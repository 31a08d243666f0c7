"""`<out>/run.json`: what a result was measured with, written beside every result a command writes.

date (UTC), git commit (and whether the tree had changes), the machine (CPU model, the flags that
decide CPU speed: AVX2, AVX-512, AVX-512 bf16, AMX; cores; an accelerator if any), torch's
version, the command line, the config (precision included) and the checkpoints it read, each by
its drafter digest (dcoco.models.drafter.catalogue). `scripts/reproduce/results_index.py` builds
results/INDEX.md from these records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import torch

from dcoco.errors import DcocoError
from dcoco.models.cpu.cpu_info import cpu_info
from dcoco.models.drafter.catalogue import drafter_digest
from dcoco.paths import REPO_ROOT, portable, portable_record

RUN_FILE = "run.json"
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def machine() -> dict:
    cpu = cpu_info()
    record = {"cpu": cpu.model, "flags": [f for f in SPEED_FLAGS if f in cpu.flags],
              "cores": os.cpu_count()}  # fmt: skip
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
    return record


def check_same_machine(sessions: list[dict], run_dir: Path) -> None:
    """A resumed run continues on the kind of machine it started on: its timings and ratios are
    one machine's (`sessions` of a run's config.json, each with the `machine()` it ran on, or only
    the CPU model for older runs)."""
    if not sessions:
        return
    first, here = sessions[0], machine()
    then = first.get("machine") or {"cpu": first.get("cpu")}
    if any(then[key] != here[key] for key in then if key in ("cpu", "flags")):
        raise DcocoError(
            f"{portable(run_dir)} was measured on {then['cpu']} {' '.join(then.get('flags', []))}; "
            f"this machine is {here['cpu']} {' '.join(here['flags'])}: timings do not carry "
            "across machines, so start another --run-name here"
        )


def keep_first_precision(config, path: Path) -> None:
    """A resumed run (its config.json at `path`) decodes at the precision its first session ran
    at: `auto`, chosen again from timings on a shared machine, may land elsewhere, and one run
    would mix two settings."""
    try:
        sessions = json.loads(path.read_text())["sessions"] if path.is_file() else []
    except (ValueError, KeyError, TypeError) as error:
        raise DcocoError(f"{path.parent.name}/{path.name} is unreadable: {error}") from error
    if not sessions:
        return
    first = sessions[0]
    if config.dtype == "auto":
        config.dtype = first["dtype"]
    if config.head_dtype == "auto":
        config.head_dtype = first.get("head_dtype", "target")  # runs before the head setting


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def method_checkpoints(methods, target: str) -> dict:
    """spec -> checkpoint directory, for the drafter methods among `methods` (as `target`'s
    defaults resolve them)."""
    from dcoco.decode.methods import DRAFTER_METHODS, MethodOptions, checkpoint_dir, parse_method

    named = SimpleNamespace(name=Path(target).name)
    found = {}
    for method in methods:
        spec = parse_method(method)
        if spec.method in DRAFTER_METHODS:
            found[method] = checkpoint_dir(spec, named, MethodOptions())
    return found


def write_run_record(out: str | Path, command: str, config, checkpoints: dict | None = None):
    """Write `<out>/run.json` for a result of `command` measured with `config` (a dataclass)
    and `checkpoints` (name -> directory)."""
    digests = {}
    for name, path in (checkpoints or {}).items():
        try:
            digests[name] = drafter_digest(Path(path))
        except (OSError, RuntimeError):  # a missing or unreadable checkpoint: recorded as such
            digests[name] = None
    record = {
        "command": command,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": machine(),
        "torch": torch.__version__,
        # comma lists of paths (--methods a@/x,b@/y; train-curves' runs) made portable item by item
        "argv": [
            ",".join(portable(p) if p.startswith("/") else p for p in a.split(","))
            for a in sys.argv
        ],
        "config": dataclasses.asdict(config),
        "checkpoints": digests,
    }
    path = Path(out) / RUN_FILE
    path.write_text(json.dumps(portable_record(record), indent=2) + "\n")
    return path
