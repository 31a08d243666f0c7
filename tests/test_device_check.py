"""The prepared GPU check's dry run (`scripts/device_check.sh --cpu`): every check runs on the CPU
(gloo in place of NCCL, fp32 in place of bf16 autocast), prints one line, and passes."""

from __future__ import annotations

import os
import subprocess

import pytest

from dcoco.paths import REPO_ROOT

CHECKS = ("greedy", "sampling", "drafter", "corrector", "nccl", "compiled")


@pytest.mark.slow
def test_the_device_check_dry_run_passes_every_check():
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "device_check.sh"), "--cpu"],
        capture_output=True, text=True, check=False, timeout=900,
        env={**os.environ, "DEVICE_CHECK_TIMEOUT": "840"},  # a busy 2-core CI machine
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert [line.split()[1] for line in lines if line.startswith("PASS ")] == list(CHECKS)
    assert lines[-1] == f"{len(CHECKS)} passed, 0 failed"
