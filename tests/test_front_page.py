"""The house kept in order (`make lint` runs these too): the README is a front page of at most
150 lines, and results/ is a ledger of at most 30 folders whose INDEX.md is current."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dcoco.paths import REPO_ROOT

README_MAX_LINES = 150

pytestmark = pytest.mark.skipif(not (REPO_ROOT / "README.md").is_file(), reason="not a checkout")


def test_readme_is_a_front_page():
    lines = (REPO_ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): dated results and history "
        "belong in docs/lab/"
    )


def test_results_ledger_is_current():
    script = REPO_ROOT / "scripts" / "reproduce" / "results_index.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
