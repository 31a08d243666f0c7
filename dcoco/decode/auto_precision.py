"""`--dtype auto` and `--head-dtype auto`: the target's precision and its LM head's for this
machine and these methods, from measured costs.

Which precision decodes fastest depends on the CPU (native or emulated bf16, AMX, int4 kernels) and
on the method: the 4-bit GGUF codes make a 1-token step much cheaper than bf16, while a k-token
verify gains less (the int4 kernel's cost grows with the row count). On a CPU that emulates bf16 the
LM head is the same trade at a smaller scale: in fp32 it costs a step more and a verify less
(dcoco.models.target.head_precision). So each setting's forward-cost curve is measured on this
machine (dcoco.decode.cost_curve, cached), and auto takes the setting under which the run's best
method expects the most tokens per millisecond: E(k) / (verify(k + 1) + draft) at its best draft
length k, with the method's stored per-slot acceptance and its draft pass (and correction) timed at
that setting, or 1 / step(1) where no draft pays (plain). The choice is cached per machine, target
and methods; `dcoco profile --refresh` redoes it. On CUDA auto is bf16 with the target's head.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
from pathlib import Path

import torch

from dcoco.decode.auto_draft import DRAFT_PASS
from dcoco.decode.cost_curve import (
    KERNELS,
    CostCurve,
    forward_curves,
    machine_fingerprint,
    measure_draft,
)
from dcoco.decode.draft_length import FLAT_PRIOR, expected_tokens
from dcoco.decode.methods import MethodOptions, build_proposer, resolve_method
from dcoco.errors import DcocoError
from dcoco.models.cpu.cpu_kernels import kernels_state
from dcoco.models.drafter.drafter_io import stored_slot_accuracy
from dcoco.models.target.head_precision import check_head_dtype, fp32_head_pays
from dcoco.models.target.int4_dot import int4_dot_available
from dcoco.models.target.loading import default_device, gguf_file, load_target
from dcoco.models.target.precision import GGUF_PRECISIONS
from dcoco.paths import cache_dir

# CPU precisions auto compares, where the target has them (precision_available)
CANDIDATES = ("bf16", "gguf", "gguf-a8", "fp32")


def resolve_precision(config, methods: list[str], refresh: bool = False) -> tuple[str, str]:
    """(`config.dtype`, `config.head_dtype`), each `auto` replaced by the measured choice
    (printed to stderr, cached); `methods`: our method specs the run decodes with (rows at their
    own precision and peers left out)."""
    head = check_head_dtype(config.head_dtype)
    device = torch.device(config.device) if config.device else default_device()
    if device.type != "cpu":
        return ("bf16" if config.dtype == "auto" else config.dtype), _plain(head)
    if config.dtype != "auto" and (head != "auto" or not fp32_head_pays(config.dtype, device)):
        return config.dtype, _plain(head)
    record = auto_choice(config, methods, refresh)
    return record["dtype"], record["head_dtype"]


def auto_choice(config, methods: list[str], refresh: bool = False, announce: bool = True) -> dict:
    """The cached (or newly measured) choice for a CPU among the settings `config` leaves open:
    {"dtype", "head_dtype", "tokens_per_ms" per setting, "best" per setting: the method, draft
    length k and draft ms behind its rate, "draft_ms" per setting and drafter method (its pass
    and correction at its longest draft), "methods"}. A setting is named by its precision, with
    " fp32-head" where its LM head runs in fp32 (dcoco.models.target.head_precision)."""
    methods = sorted(set(methods)) or ["plain"]
    path = _choice_path(config, methods)
    if path.is_file() and not refresh:
        try:
            record = json.loads(path.read_text())
            record["dtype"], record["head_dtype"], record["best"], record["draft_ms"]  # noqa: B018
            if announce:
                _announce(record)
            return record
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: choose again
    settings = _settings(config)
    targets = {
        name: load_target(
            config.target, dtype, config.device or None, config.attention, config.matmul, head
        )  # fmt: skip
        for name, (dtype, head) in settings.items()
    }
    curves = dict(zip(targets, forward_curves(list(targets.values())), strict=True))
    options = config.method_options()
    drafts = _draft_costs(targets, methods, options)
    best = {
        name: _best_method(targets[name], curves[name], drafts[name], methods, options)
        for name in settings
    }
    rates = {name: choice.pop("rate") for name, choice in best.items()}
    chosen = max(rates, key=rates.get)
    record = {
        "dtype": settings[chosen][0],
        "head_dtype": settings[chosen][1],
        "tokens_per_ms": rates,
        "best": best,
        "draft_ms": drafts,
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


def _best_method(
    target, curve: CostCurve, drafts: dict, methods: list[str], options: MethodOptions
) -> dict:
    """{"rate", "method", "k", "draft_ms"} of the method expecting the most tokens per ms on
    `curve`, each drafter method's draft costing `drafts[method]` ms."""
    best: dict = {"rate": 0.0}
    for method in methods:
        draft_ms = drafts.get(method, 0.0)
        rate, k = method_choice(method, target, curve, options, draft_ms)
        if rate > best["rate"]:
            best = {"rate": round(rate, 5), "method": method, "k": k, "draft_ms": draft_ms}
    return best


def _draft_costs(targets: dict, methods: list[str], options, rounds: int = 3) -> dict:
    """{setting: {drafter method: ms of its pass and correction at its longest draft}}, the
    settings timed in turn, `rounds` times, so that load elsewhere hits them alike."""
    costs: dict = {name: {} for name in targets}
    for method in methods:
        proposers = {
            name: build_proposer(method, target, options) for name, target in targets.items()
        }
        if any(proposer is None for proposer in proposers.values()):
            continue  # drafts nothing (plain)
        samples: dict = {name: [] for name in targets}
        for _ in range(rounds):
            for name, proposer in proposers.items():
                ms = measure_draft(targets[name], proposer, proposer.num_draft_tokens, repeats=3)
                samples[name].append(sum(ms))
        for name, values in samples.items():
            costs[name][method] = round(statistics.median(values), 2)
    return costs


def has_gguf(spec: str) -> bool:
    """Whether the target has a GGUF file (the gguf precisions exist for it)."""
    try:
        gguf_file(spec)
    except DcocoError:
        return False
    return True


def precision_available(dtype: str, spec: str) -> bool:
    """Whether `dtype` runs for the target `spec` here: the gguf precisions need its GGUF file,
    gguf-a8 the w4a8 kernel too (dcoco.models.target.int4_dot)."""
    if dtype not in GGUF_PRECISIONS:
        return True
    return has_gguf(spec) and (dtype == "gguf" or int4_dot_available())


def setting_label(dtype: str, head_dtype: str) -> str:
    return dtype if head_dtype == "target" else f"{dtype} {head_dtype}-head"


def _settings(config) -> dict[str, tuple[str, str]]:
    """label -> (dtype, head_dtype) of each setting auto weighs: the candidate precisions (or the
    one asked for), each with the target's head and, where it may pay, the fp32 head."""
    if config.dtype != "auto":
        dtypes = [config.dtype]
    else:
        dtypes = [d for d in CANDIDATES if precision_available(d, config.target)]
    cpu = torch.device("cpu")
    settings = {}
    for dtype in dtypes:
        heads = ["target", "fp32"] if fp32_head_pays(dtype, cpu) else ["target"]
        for head in heads if config.head_dtype == "auto" else [config.head_dtype]:
            settings[setting_label(dtype, head)] = (dtype, head)
    return settings


def _plain(head_dtype: str) -> str:
    """The head setting where auto has nothing to weigh: the target's own."""
    return "target" if head_dtype == "auto" else head_dtype


def _choice_path(config, methods: list[str]) -> Path:
    key = {
        **machine_fingerprint(),
        "target": config.target,
        "attention": config.attention,
        "matmul": config.matmul,
        "dtype": config.dtype,
        "head_dtype": config.head_dtype,
        "methods": methods,
        "draft_dtype": config.draft_dtype,
        "draft_vocab": config.draft_vocab,
        "draft_block": config.draft_block,
        "compile_head": config.compile_head,
        "kernels": KERNELS,
        "cpu_kernels": kernels_state(),
        "draft_pass": DRAFT_PASS,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / f"auto-dtype-{Path(config.target).name}-{digest}.json"


def describe(record: dict) -> str:
    """Each setting's expected tokens/ms and what it comes from (for `dcoco profile`)."""
    parts = []
    for setting, rate in record["tokens_per_ms"].items():
        best = record["best"][setting]
        if best["k"] == 0:  # no draft pays: whichever method, it decodes as plain does
            parts.append(f"{setting} {rate:.4f} (a plain step)")
            continue
        how = f"{best['k']} drafts, draft {best['draft_ms']:.1f} ms"
        parts.append(f"{setting} {rate:.4f} ({best['method']}: {how})")
    return "; ".join(parts)


def _announce(record: dict) -> None:
    rates = ", ".join(f"{d} {r:.4f}" for d, r in record["tokens_per_ms"].items())
    chosen = setting_label(record["dtype"], record["head_dtype"])
    print(
        f"dcoco: dtype auto -> {chosen} (expected tokens/ms of the best method on this "
        f"machine: {rates})",
        file=sys.stderr,
    )
