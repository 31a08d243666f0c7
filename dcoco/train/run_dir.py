"""What a training run keeps in its output directory: a JSONL log, a resumable checkpoint and,
at the end, the provenance of the trained artefact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import dcoco
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter_io import TRAIN_LOG_FILE
from dcoco.paths import REPO_ROOT, portable_record

LOG_FILE = TRAIN_LOG_FILE
CKPT_FILE = Path("ckpt") / "state.pt"


class RunDir:
    """`<out>/train_log.jsonl` (appended, so a resumed run keeps its history) and `<out>/ckpt/`."""

    def __init__(self, out: str | Path, writer: bool = True):
        """`writer=False` (a data-parallel rank other than 0) reads checkpoints, writes nothing."""
        self.path = Path(out)
        self.path.mkdir(parents=True, exist_ok=True)
        self._log = (self.path / LOG_FILE).open("a") if writer else None

    def log(self, record: dict) -> None:
        if self._log is None:
            return
        self._log.write(json.dumps({"time": time.time(), **record}) + "\n")
        self._log.flush()  # a killed run keeps every line up to its last step

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def save_checkpoint(self, state: dict) -> None:
        if self._log is None:
            return
        path = self.path / CKPT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(".partial")
        torch.save(state, staging)
        os.replace(staging, path)  # an interrupted save never clobbers the previous checkpoint

    def load_checkpoint(self, device: torch.device) -> dict | None:
        path = self.path / CKPT_FILE
        if not path.is_file():
            return None
        try:
            return torch.load(path, map_location=device, weights_only=True)
        except (OSError, RuntimeError, EOFError) as error:
            raise DcocoError(
                f"cannot resume from {path} ({error}); delete it to start over"
            ) from error


def provenance(**fields) -> dict:
    """`fields` plus what reproduces the run: argv, git commit and package versions. Paths in
    them are recorded `portable` (dcoco.paths), since the record ships with the artefact."""
    import transformers

    record = {
        **fields,
        "argv": sys.argv,
        "git_commit": _git_commit(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "dcoco": dcoco.__version__,
            "python": sys.version.split()[0],
        },
    }
    return portable_record(record)


def _git_commit() -> str | None:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # not a checkout, or no git: provenance still records everything else
    return result.stdout.strip() or None
