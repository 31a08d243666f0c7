"""`dcoco profile`: what a decoding cycle costs on this machine, and which setting the engine uses.

It times the target's forward over 1..N tokens after a 300-token context, at each precision and
matmul kernel (aten, or oneDNN with prepacked weights), and on a CPU that emulates bf16 also with
the LM head in fp32 (`fp32-head`); the drafter's pass and the draft head's
correction for each number of slots; and says which precision, attention and matmul kernels and
draft length the engine picks by default. Speculation pays when verifying
k + 1 tokens costs about one step, so the ratio verify(8) / step(1) is the first number to read.
The curves are cached per machine (`$DCOCO_CACHE_DIR/profiles/`); `--num-draft-tokens auto` reads
the same cache. `--json` prints one object whose curves map token counts ("1".."N") to ms.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

import torch

from dcoco.config import Command
from dcoco.decode.auto_draft import forget_draft_settings
from dcoco.decode.auto_precision import (
    auto_choice,
    describe,
    precision_available,
    resolve_precision,
    setting_label,
)
from dcoco.decode.cost_curve import (
    CONTEXT,
    CostCurve,
    forward_curve,
    forward_curves,
    machine_fingerprint,
    measure_draft,
)
from dcoco.decode.draft_length import DraftLengthPolicy
from dcoco.decode.methods import MethodOptions, build_proposer, check_method
from dcoco.decode.session import DecodeConfig
from dcoco.errors import DcocoError
from dcoco.models.target.head_precision import fp32_head_pays
from dcoco.models.target.loading import DEFAULT_TARGET, default_device, load_target
from dcoco.models.target.packed_linear import resolve_matmul
from dcoco.models.target.precision import check_precision, load_dtype

DEFAULT_MATMUL = DecodeConfig.matmul


@dataclass
class ProfileConfig:
    target: str = DEFAULT_TARGET  # embedded name or HF model directory
    dtypes: tuple[str, ...] = ("bf16", "gguf", "gguf-a8", "int8", "fp32")  # to time, where they run
    attention: str = "auto"  # the target's attention kernel: auto | eager | sdpa
    matmuls: tuple[str, ...] = ("aten", "onednn")  # linear kernels to time (where they apply)
    methods: tuple[str, ...] = ("dflash", "dcoco")  # drafter methods whose draft cost to time
    max_tokens: int = 16  # time forwards over 1..max-tokens tokens
    threads: int = 0  # CPU threads for torch; 0 = torch's default
    device: str = ""  # empty = CUDA when present, else CPU
    refresh: bool = False  # measure again even where a cached curve exists
    compile_head: bool = True  # time the DCOCO corrector's pick compiled, as decoding runs it
    json: bool = False  # print one JSON object instead of tables


def run(config: ProfileConfig) -> int:
    if config.max_tokens < 8:
        raise DcocoError("--max-tokens must be >= 8 (the report reads verify(8))")
    methods = [check_method(m) for m in config.methods if m.strip()]
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    report: dict = {"machine": machine_fingerprint(), "target": config.target, "forward_ms": {}}
    # every setting timed together (forward_curves), so their curves compare, auto's too
    settings = _settings(config)
    targets = [
        load_target(config.target, dtype, config.device or None, config.attention, matmul, head)
        for dtype, matmul, head in settings
    ]
    if config.refresh:
        forget_draft_settings()  # the drafters' measured precisions too
    curves = forward_curves(targets, config.max_tokens, refresh=config.refresh)
    for curve in curves:
        report["forward_ms"][curve.setting] = _keys(curve.forward_ms)
    auto = DecodeConfig(target=config.target, device=config.device, attention=config.attention,
                        compile_head=config.compile_head)  # fmt: skip
    chosen, head = resolve_precision(auto, methods, refresh=config.refresh)
    report["auto_dtype"] = setting_label(chosen, head)
    if (torch.device(config.device) if config.device else default_device()).type == "cpu":
        record = auto_choice(auto, methods, announce=False)
        report["auto_why"], report["draft_ms_by_dtype"] = describe(record), record["draft_ms"]
    default = (chosen, _resolved(DEFAULT_MATMUL, chosen, config), head)
    if default in settings:
        default_target = targets[settings.index(default)], curves[settings.index(default)]
    else:  # the default setting is profiled whether asked for or not
        target = load_target(config.target, default[0], config.device or None, config.attention,
                             default[1], default[2])  # fmt: skip
        default_target = target, forward_curve(target, config.max_tokens)
    target, curve = default_target
    report["default"] = {"setting": curve.setting, "methods": {}}
    options = MethodOptions(compile_head=config.compile_head)
    report["default"]["methods"] = _method_costs(target, curve, methods, options)
    print(json.dumps(report, indent=1) if config.json else _tables(report))
    return 0


def _settings(config: ProfileConfig) -> list[tuple[str, str, str]]:
    """(precision, matmul kernel, head dtype) to time: each kernel where it applies (oneDNN's
    prepacked linear takes CPU fp32 and bf16 only; int8 has its own kernel), with the target's
    LM head and, where auto weighs it, the fp32 head."""
    settings = []
    device = torch.device(config.device) if config.device else default_device()
    for dtype in [check_precision(d) for d in config.dtypes]:
        if not precision_available(dtype, config.target):
            continue  # no GGUF file, or no w4a8 kernel here
        kernels = {_resolved(m, dtype, config) for m in config.matmuls if m.strip()}
        heads = ("target", "fp32") if fp32_head_pays(dtype, device) else ("target",)
        settings += [
            (dtype, kernel, head) for kernel in sorted(kernels or {"aten"}) for head in heads
        ]
    return settings


def _resolved(matmul: str, dtype: str, config: ProfileConfig) -> str:
    """The kernel `matmul` names for `dtype` here: onednn where it does not apply falls back to
    aten, as `auto` would."""
    device = torch.device(config.device) if config.device else default_device()
    try:
        return resolve_matmul(matmul, dtype, load_dtype(dtype), device)
    except DcocoError:
        if matmul != "onednn":
            raise
        return "aten"


def _method_costs(target, curve: CostCurve, methods: list[str], options: MethodOptions,
                  rounds: int = 5) -> dict:  # fmt: skip
    """{method: its draft and correction ms per number of slots, the k auto starts with}: every
    method and slot count timed in turn, `rounds` times (medians), so that a slower minute of
    the machine hits them alike rather than one slot count."""
    proposers = {method: build_proposer(method, target, options) for method in methods}
    for method, proposer in proposers.items():
        if proposer is None:
            raise DcocoError(f"{method} drafts nothing: profile a drafter method")
    samples: dict = {
        (m, k): [] for m, p in proposers.items() for k in range(1, p.num_draft_tokens + 1)
    }
    for _ in range(rounds):
        for method, slots in samples:
            samples[method, slots].append(
                measure_draft(target, proposers[method], slots, repeats=3)
            )
    costs = {}
    for method, proposer in proposers.items():
        draft_ms, correct_ms = {}, {}
        for slots in range(1, proposer.num_draft_tokens + 1):
            drafts, corrects = zip(*samples[method, slots], strict=True)
            draft_ms[str(slots)] = round(statistics.median(drafts), 2)
            correct_ms[str(slots)] = round(statistics.median(corrects), 2)
        costs[method] = _costs(proposer, curve, draft_ms, correct_ms)
    return costs


def _costs(proposer, curve: CostCurve, draft_ms: dict, correct_ms: dict) -> dict:
    """A method's report entry from its measured ms, with the k auto starts with."""
    most = str(proposer.num_draft_tokens)
    policy = DraftLengthPolicy(
        curve,
        proposer.num_draft_tokens,
        proposer.acceptance_prior,
        draft_ms=float(draft_ms[most]) + float(correct_ms[most]),
    )
    vocab = getattr(getattr(proposer, "drafter", None), "draft_vocab", None)
    rows = vocab.size if vocab is not None else "all"  # the head rows a draft runs over
    return {"draft_ms": draft_ms, "correct_ms": correct_ms, "auto_k": policy.choose(),
            "draft_vocab": rows}  # fmt: skip


def _keys(curve: dict[int, float]) -> dict[str, float]:
    return {str(k): v for k, v in curve.items()}


def _tables(report: dict) -> str:
    curves = report["forward_ms"]
    counts = list(next(iter(curves.values())))
    machine = report["machine"]
    lines = [
        f"machine: {machine['cpu']} | {machine['threads']} threads | torch {machine['torch']}",
        f"target {report['target']}: forward over n tokens after {CONTEXT} of context, median ms",
        "| setting | " + " | ".join(counts) + " | verify(8) / step(1) |",
        "|---|" + "--:|" * (len(counts) + 1),
    ]
    for setting, curve in curves.items():
        cells = " | ".join(f"{curve[n]:.1f}" for n in counts)
        lines.append(f"| {setting} | {cells} | {curve['8'] / curve['1']:.2f}x |")
    default = report["default"]
    lines.append(
        f"\n--dtype auto picks {report['auto_dtype']} here (see dcoco.decode.auto_precision); "
        f"the engine's default: {default['setting']}, --num-draft-tokens auto"
    )
    if "auto_why" in report:
        lines.append(f"auto's expected tokens/ms by precision: {report['auto_why']}")
        lines.extend(_draft_table(report["draft_ms_by_dtype"]))
    for method, costs in default["methods"].items():
        draft = " ".join(f"{k}:{v:.1f}" for k, v in costs["draft_ms"].items())
        correct = " ".join(f"{k}:{v:.1f}" for k, v in costs["correct_ms"].items())
        lines.append(
            f"{method}: draft ms by slots {draft} | correct ms {correct} | LM head rows "
            f"{costs['draft_vocab']} (--draft-vocab)"
        )
        start = costs["auto_k"]
        lines.append(f"{method}: auto starts at k = {start} (then follows acceptance; 0: none)")
    return "\n".join(lines)


def _draft_table(by_dtype: dict) -> list[str]:
    """The drafter methods' pass + correction at their longest draft, ms, one column a precision
    (what auto's rates count; none when the run's methods draft with no drafter)."""
    methods = sorted({m for costs in by_dtype.values() for m in costs})
    if not methods:
        return []
    lines = [
        "draft + correct ms at the longest draft, by precision:",
        "| method | " + " | ".join(by_dtype) + " |",
        "|---|" + "--:|" * len(by_dtype),
    ]
    for method in methods:
        cells = " | ".join(f"{costs.get(method, float('nan')):.1f}" for costs in by_dtype.values())
        lines.append(f"| {method} | {cells} |")
    return lines


COMMAND = Command(
    "profile",
    "the cost of a decoding cycle on this machine (forward per token count, draft, correct)",
    ProfileConfig,
    run,
    description=__doc__.split("\n\n")[1],
)
