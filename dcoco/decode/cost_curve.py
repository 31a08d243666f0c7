"""The target's forward-cost curve: median milliseconds to run n = 1..N tokens over a cached
context, measured on the machine it is used on and cached per machine and setting.

Speculation pays only when verifying k drafts costs about one decoding step, and where that holds
depends on the CPU (AVX2 vs AVX-512 with bf16), the precision, the attention kernel and the thread
count. So nothing here is assumed: `--num-draft-tokens auto` and `dcoco profile` read this curve.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dcoco.decode.proposers import DraftContext, Proposer
from dcoco.models.cpu.cpu_info import cpu_info
from dcoco.models.cpu.cpu_kernels import kernels_state
from dcoco.models.target.cache import crop_cache
from dcoco.models.target.target import TargetModel
from dcoco.paths import cache_dir

CONTEXT = 300  # tokens already in the cache when a step is timed (a mid-length chat reply)
CURVE_TOKENS = 16  # the least a curve covers, so one measurement serves every draft length
# Bumped when a kernel change moves what a forward costs, so that curves and choices cached before
# it are measured again (2: rowwise's fp32 product for half-precision rows on AVX2 CPUs; 3: decoding
# calls through dcoco.models.target.layer_loop; 4: the fp32 product on every CPU without AMX; 5:
# that product's K/V cached in fp32; 6: fused CPU kernels for norms and rotary, and whether they
# built here, dcoco.models.cpu.cpu_kernels; 7: w4a8 products, dcoco.models.target.int4_dot, the
# drafter's C++ attention and the fused row argmax; 8: w4a8 rows rounded in C++ from bf16, the
# drafter's MLP in one call, its attention reading grouped heads in place, the copy bonus).
KERNELS = 8


@dataclass(frozen=True)
class CostCurve:
    setting: str  # what was timed, e.g. "bf16 eager cpu 2 threads"
    forward_ms: dict[int, float]  # tokens in one forward -> median ms
    batch: str = ""  # curves timed together (measure_forwards) share it; compare only those

    def ms(self, tokens: int) -> float:
        """The cost of `tokens`; beyond the measured range, the last point grown linearly."""
        last = max(self.forward_ms)
        if tokens <= last:
            return self.forward_ms[tokens]
        return self.forward_ms[last] * tokens / last


def setting_name(target: TargetModel) -> str:
    device = target.device
    threads = torch.get_num_threads()
    where = f"cpu {threads} threads" if device.type == "cpu" else str(device)
    head = " fp32-head" if target.head_dtype == "fp32" else ""
    return f"{target.precision}{head} {target.attention} {target.matmul} {where}"


def measure_forward(target: TargetModel, max_tokens: int = 16, repeats: int = 9) -> CostCurve:
    """Time the target's forward over 1..max_tokens tokens after a CONTEXT-token prefill."""
    return measure_forwards([target], max_tokens, repeats)[0]


def measure_forwards(
    targets: list[TargetModel], max_tokens: int = 16, repeats: int = 9
) -> list[CostCurve]:
    """Each target's curve, timed together: every round visits every target at every token
    count, so that a burst of load elsewhere on the machine (minutes apart, a shared CPU's speed
    moved 1.2-1.4x here) lands on every setting alike and the settings compare fairly."""
    runs = [_ForwardRun(target, max_tokens) for target in targets]
    batch = f"{time.time():.0f}-{id(runs)}"
    times = [{tokens: [] for tokens in range(1, max_tokens + 1)} for _ in runs]
    for _ in range(repeats):
        for tokens in range(1, max_tokens + 1):
            for run, samples in zip(runs, times, strict=True):
                samples[tokens].append(run.time(tokens))
    return [
        CostCurve(
            setting_name(run.target),
            {n: round(statistics.median(s) * 1000, 2) for n, s in samples.items()},
            batch,
        )
        for run, samples in zip(runs, times, strict=True)
    ]


class _ForwardRun:
    """A target with a CONTEXT-token cache, ready to time forwards over 1..max_tokens tokens."""

    def __init__(self, target: TargetModel, max_tokens: int):
        self.target = target
        self.context = max(1, min(CONTEXT, target.max_context - max_tokens - 1))
        generator = torch.Generator().manual_seed(0)
        vocab = target.info.vocab_size
        ids = torch.randint(0, vocab, (1, self.context + max_tokens), generator=generator)
        self.ids = ids.to(target.device)
        self.cache = target.new_cache()
        target.forward(self.ids[:, : self.context], self.cache, last_logits_only=True)
        for tokens in range(1, max_tokens + 1):  # one untimed sweep: every shape's kernels warm
            self.time(tokens)

    def time(self, tokens: int) -> float:
        """Seconds of one forward over `tokens` (the cache is cropped back after)."""
        start = time.perf_counter()
        self.target.forward(self.ids[:, self.context : self.context + tokens], self.cache)
        _sync(self.target.device)
        elapsed = time.perf_counter() - start
        crop_cache(self.cache, self.context)
        return elapsed


def measure_draft(
    target: TargetModel, proposer: Proposer, slots: int, repeats: int = 7
) -> tuple[float, float]:
    """Median (draft ms, correct ms) of a steady-state proposer cycle drafting `slots` tokens: 2
    new taps over a CONTEXT-token cache (random tokens and taps: the cost does not read them)."""
    width = target.info.hidden_size * len(proposer.feature_layers)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.info.vocab_size, (CONTEXT + 2,), generator=generator)
    features = torch.randn(1, CONTEXT + 2, width, generator=generator).to(target.dtype)
    tokens, features = tokens.to(target.device), features.to(target.device)
    proposer.start(tokens[:CONTEXT].tolist())
    proposer.propose(DraftContext(tokens[:CONTEXT], features[:, :CONTEXT], slots))  # prefill
    drafts, corrects = [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        proposal = proposer.propose(DraftContext(tokens, features[:, CONTEXT - 1 :], slots))
        drafts.append((time.perf_counter() - start - proposal.correct_s) * 1000)
        corrects.append(proposal.correct_s * 1000)
        if getattr(proposer, "cache", None) is not None:  # a drafter's context K/V: back to c
            crop_cache(proposer.cache, CONTEXT - 1)
    return round(sorted(drafts[1:])[repeats // 2], 2), round(sorted(corrects[1:])[repeats // 2], 2)


def interleaved_ms(calls: list[Callable[[], object]], repeats: int, warmup: int = 2) -> list[float]:
    """Median ms of each of `calls`, run in turn call after call after `warmup` untimed rounds,
    so that load elsewhere on the machine hits them alike (how scripts/reproduce compares)."""
    times: list[list[float]] = [[] for _ in calls]
    for round_ in range(warmup + repeats):
        for call, samples in zip(calls, times, strict=True):
            start = time.perf_counter()
            call()
            if round_ >= warmup:
                samples.append(time.perf_counter() - start)
    return [statistics.median(samples) * 1000 for samples in times]


def ms_table(corner: str, columns: list[str], rows: dict[str, list[float]]) -> str:
    """A markdown table of ms (the timing scripts in scripts/reproduce print these): `corner`
    heads the names' column, `columns` the others, one row per name."""
    lines = [f"| {corner} | " + " | ".join(columns) + " |", "|---|" + "--:|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(f"{ms:.2f}" for ms in cells) + " |"
              for name, cells in rows.items()]  # fmt: skip
    return "\n".join(lines)


def forward_curve(target: TargetModel, max_tokens: int = 16, refresh: bool = False) -> CostCurve:
    """The cached curve for this machine and setting, measured (a few seconds) when missing."""
    return forward_curves([target], max_tokens, refresh)[0]


def forward_curves(
    targets: list[TargetModel], max_tokens: int = 16, refresh: bool = False
) -> list[CostCurve]:
    """The cached curve of each target, all from one measurement: when any is missing, or they
    were timed apart (`batch`), or with `refresh`, all are measured together (measure_forwards)
    and cached."""
    max_tokens = max(max_tokens, CURVE_TOKENS)
    paths = [_curve_path(target, max_tokens) for target in targets]
    curves = [None if refresh else _read_curve(path) for path in paths]
    batches = {curve.batch if curve else None for curve in curves}
    if len(batches) > 1 or (len(curves) > 1 and "" in batches):  # "": cached before batches
        curves = [None] * len(curves)  # timed apart: a setting's load then is not another's
    missing = [i for i, curve in enumerate(curves) if curve is None]
    if missing:
        print(f"dcoco: timing the target's forward for 1..{max_tokens} tokens once "
              f"({len(missing)} setting(s))", file=sys.stderr)  # fmt: skip
        measured = measure_forwards([targets[i] for i in missing], max_tokens)
        for i, curve in zip(missing, measured, strict=True):
            paths[i].parent.mkdir(parents=True, exist_ok=True)
            staging = paths[i].with_suffix(".partial")
            staging.write_text(json.dumps(asdict(curve), indent=1))
            staging.replace(paths[i])
            curves[i] = curve
    return curves


def _read_curve(path: Path) -> CostCurve | None:
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        points = {int(k): float(v) for k, v in record["forward_ms"].items()}
        return CostCurve(record["setting"], points, str(record.get("batch", "")))
    except (ValueError, KeyError, TypeError, AttributeError):
        print(f"dcoco: cost curve {path} is unreadable; measuring it again", file=sys.stderr)
        return None


def machine_fingerprint() -> dict[str, str]:
    """What the curve depends on besides the target: CPU model and ISA, threads, torch."""
    cpu = cpu_info()
    isa = sorted(f for f in cpu.flags if f.startswith(("avx", "amx", "fma")))
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return {
        "cpu": cpu.model,
        "gpu": gpu,
        "isa": " ".join(isa),
        "threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
    }


def _curve_path(target: TargetModel, max_tokens: int) -> Path:
    key = {
        **machine_fingerprint(),
        "target": target.info.fingerprint,
        "setting": setting_name(target),
        "context": str(CONTEXT),
        "max_tokens": str(max_tokens),
        "kernels": str(KERNELS),
        "cpu_kernels": kernels_state() if target.device.type == "cpu" else "-",
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / f"{target.name}-{digest}.json"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
