"""`--dtype auto`: the target precision for this machine and these methods, from measured costs.

Which precision decodes fastest depends on the CPU (native or emulated bf16, AMX, int4 kernels)
and on the method: the 4-bit GGUF codes make a 1-token step much cheaper than bf16, while a
k-token verify gains less (the int4 kernel's cost grows with the row count). So each candidate's
forward-cost curve is measured on this machine (dcoco.decode.cost_curve, cached), and auto takes
the precision under which the run's best method expects the most tokens per millisecond:
E(k) / (verify(k + 1) + draft) at its best draft length k, with the method's stored per-slot
acceptance and its draft pass (and correction) timed at that precision, or 1 / step(1) where no
draft pays (plain). The draft counts: a drafter runs in the target's dtype, so under bf16 and gguf
on a CPU that emulates bf16 its pass cost 2-3x its fp32 one (`dcoco profile`, Zen 3). The choice
is cached per machine, target and methods; `dcoco profile --refresh` redoes it. On CUDA auto is
bf16.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from dcoco.decode.cost_curve import (
    KERNELS,
    CostCurve,
    forward_curve,
    machine_fingerprint,
    measure_draft,
)
from dcoco.decode.draft_length import FLAT_PRIOR, expected_tokens
from dcoco.decode.methods import MethodOptions, build_proposer, resolve_method
from dcoco.errors import DcocoError
from dcoco.models.drafter_io import stored_slot_accuracy
from dcoco.models.loading import default_device, gguf_file, load_target
from dcoco.paths import cache_dir

CANDIDATES = ("bf16", "gguf", "fp32")  # CPU precisions auto compares, where the target has them


def resolve_dtype(config, methods: list[str], refresh: bool = False) -> str:
    """`config.dtype`, or for `auto` the measured choice (printed to stderr, cached); `methods`:
    our method specs the run decodes with (rows at their own precision and peers left out)."""
    if config.dtype != "auto":
        return config.dtype
    device = torch.device(config.device) if config.device else default_device()
    if device.type != "cpu":
        return "bf16"
    return auto_choice(config, methods, refresh)["dtype"]


def auto_choice(config, methods: list[str], refresh: bool = False, announce: bool = True) -> dict:
    """The cached (or newly measured) choice for a CPU: {"dtype", "tokens_per_ms" per candidate,
    "best" per candidate: the method, draft length k and draft ms behind its rate, "draft_ms" per
    candidate and drafter method (its pass and correction at its longest draft), "methods"}."""
    methods = sorted(set(methods)) or ["plain"]
    path = _choice_path(config, methods)
    if path.is_file() and not refresh:
        try:
            record = json.loads(path.read_text())
            record["dtype"], record["best"], record["draft_ms"]  # noqa: B018 -- this version
            if announce:
                _announce(record)
            return record
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: choose again
    best = {dtype: _best_method(config, dtype, methods) for dtype in _candidates(config.target)}
    rates = {dtype: choice.pop("rate") for dtype, choice in best.items()}
    record = {
        "dtype": max(rates, key=rates.get),
        "tokens_per_ms": rates,
        "best": best,
        "draft_ms": {dtype: choice.pop("drafts") for dtype, choice in best.items()},
        "methods": methods,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    if announce:
        _announce(record)
    return record


def method_choice(
    method: str, target, curve: CostCurve, options: MethodOptions, draft_ms: float = 0.0
) -> tuple[float, int]:
    """Expected tokens per ms of `method` on `curve` at its best draft length, each draft
    costing `draft_ms` (the proposer's pass and correction), and that length k (0: a plain step,
    which counts where no draft pays)."""
    resolved = resolve_method(method, target, options)
    rates = {0: 1.0 / curve.ms(1)}
    if resolved.spec.method != "plain":
        prior = list(stored_slot_accuracy(resolved.path)) if resolved.path else []
        acceptance = prior + [FLAT_PRIOR] * (resolved.max_slots - len(prior))
        for k in range(1, resolved.max_slots + 1):
            rates[k] = expected_tokens(acceptance, k) / (curve.ms(k + 1) + draft_ms)
    k = max(rates, key=rates.get)
    return rates[k], k


def _best_method(config, dtype: str, methods: list[str]) -> dict:
    """{"rate", "method", "k", "draft_ms"} of the method expecting the most tokens per ms, and
    "drafts": every drafter method's draft ms."""
    target = load_target(config.target, dtype, config.device or None, config.attention,
                         config.matmul)  # fmt: skip
    curve = forward_curve(target)
    options = config.method_options()
    best: dict = {"rate": 0.0}
    drafts = {}
    for method in methods:
        proposer = build_proposer(method, target, options)
        draft_ms = 0.0
        if proposer is not None:  # its cost at the longest draft, as the engine's policy takes it
            draft_ms = round(sum(measure_draft(target, proposer, proposer.num_draft_tokens)), 2)
            drafts[method] = draft_ms
        rate, k = method_choice(method, target, curve, options, draft_ms)
        if rate > best["rate"]:
            best = {"rate": round(rate, 5), "method": method, "k": k, "draft_ms": draft_ms}
    return {**best, "drafts": drafts}


def has_gguf(spec: str) -> bool:
    """Whether the target has a GGUF file (the gguf precision exists for it)."""
    try:
        gguf_file(spec)
    except DcocoError:
        return False
    return True


def _candidates(spec: str) -> list[str]:
    return [d for d in CANDIDATES if d != "gguf" or has_gguf(spec)]


def _choice_path(config, methods: list[str]) -> Path:
    key = {
        **machine_fingerprint(),
        "target": config.target,
        "attention": config.attention,
        "matmul": config.matmul,
        "methods": methods,
        "draft_dtype": config.draft_dtype,
        "kernels": KERNELS,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / f"auto-dtype-{Path(config.target).name}-{digest}.json"


def describe(record: dict) -> str:
    """Each candidate's expected tokens/ms and what it comes from (for `dcoco profile`)."""
    parts = []
    for dtype, rate in record["tokens_per_ms"].items():
        best = record["best"][dtype]
        if best["k"] == 0:  # no draft pays: whichever method, it decodes as plain does
            parts.append(f"{dtype} {rate:.4f} (a plain step)")
            continue
        how = f"{best['k']} drafts, draft {best['draft_ms']:.1f} ms"
        parts.append(f"{dtype} {rate:.4f} ({best['method']}: {how})")
    return "; ".join(parts)


def _announce(record: dict) -> None:
    rates = ", ".join(f"{d} {r:.4f}" for d, r in record["tokens_per_ms"].items())
    print(
        f"dcoco: dtype auto -> {record['dtype']} (expected tokens/ms of the best method on this "
        f"machine: {rates})",
        file=sys.stderr,
    )
