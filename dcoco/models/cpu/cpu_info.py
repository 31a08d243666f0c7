"""What the CPU says about itself: its model name and the kernel's ISA flags, read once.

Kernel choices (`rowwise` attention's path, dcoco.models.target.packed_linear) and the records that
key timings by machine (cost curves, run records) read the same file; this is the one parser.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

CPUINFO = "/proc/cpuinfo"


@dataclass(frozen=True)
class CpuInfo:
    model: str  # "model name", or what the platform module knows where there is no cpuinfo
    flags: frozenset[str]  # the first "flags" line's words (empty where there is none)


@functools.cache
def cpu_info(path: str = CPUINFO) -> CpuInfo:
    """The model name and flags in `path` (Linux's cpuinfo); outside Linux, the platform's name
    and no flags."""
    model, flags = "", ""
    try:
        with open(path) as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value
    except OSError:
        pass
    return CpuInfo(model or platform.processor() or platform.machine(), frozenset(flags.split()))
