"""The schedule probe's progress: lines the probe writes to its log as it times its cells, and
`dcoco serve --calibrate` following them with the share done and an estimate of the time left.

The probe (dcoco.serving.vllm.schedule_probe) runs for minutes (27 at fp32 for `dcoco` on a 2-core
Xeon, issue 69) in the vLLM interpreter with its output in a log file; each timed cell adds its
tokens to a PROGRESS line "DONE TOTAL", and the cells' tokens are near enough their cost.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from dcoco.serving.layout import time_left

PROGRESS = "dcoco: probe progress "  # the probe's log line "... DONE TOTAL" (tokens timed)


class ProbeProgress:
    """The probe's side: prints PROGRESS lines (tokens timed so far, of all cells')."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self.add(0)

    def add(self, tokens: int) -> None:
        self.done += tokens
        print(f"{PROGRESS}{self.done} {self.total}", file=sys.stderr, flush=True)


def follow(probe: subprocess.Popen, log: Path, every_s: float = 5.0,
            minute_s: float = 60.0) -> int:  # fmt: skip
    """Wait for the probe; its exit code. From the probe's first PROGRESS line in its log (the
    engine up, acceptance measured), a line every `minute_s` with the share of the timed cells'
    tokens done and an estimate of the time left."""
    begun = time.perf_counter()
    started, told, seen, progress = 0.0, 0.0, 0, (0, 0)
    while (code := probe.poll()) is None:
        time.sleep(every_s)
        lines = log.read_text(errors="replace").splitlines()
        for line in lines[seen:]:
            if line.startswith(PROGRESS):
                done, total = map(int, line[len(PROGRESS) :].split()[:2])
                progress, started = (done, total), started or time.perf_counter()
        seen = len(lines)
        if time.perf_counter() - max(told, begun) >= minute_s:
            told = time.perf_counter()
            print(_progress_line(progress, started, begun), file=sys.stderr)
    return code


def _progress_line(progress: tuple[int, int], started: float, begun: float) -> str:
    done, total = progress
    elapsed = f"{(time.perf_counter() - begun) / 60:.0f} min in"
    if not total:
        return f"dcoco: draft-schedule probe: engine start and acceptance ({elapsed})"
    left = time_left(started, done, total) if done else ""
    return f"dcoco: draft-schedule probe: {100 * done // total}% timed ({elapsed}{left})"
