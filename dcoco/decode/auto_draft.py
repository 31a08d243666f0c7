"""`--draft-dtype auto`: the drafter's precision for this machine, from its measured pass.

The rule in dcoco.decode.draft_precision.draft_setting (fp32 or w4a8 where bf16 is emulated, w4a8
or int4 on AVX-512 bf16, the target's dtype on AMX) was set on one CPU of each kind, and each kind
has surprised it: an Intel Xeon with AMX drafted at 3.4 ms in its bf16 tiles where its AVX-512
VNNI runs w4a8 too, and an AVX2 Zen 3 drafted in fp32 slower than it decoded. So on a CPU, where
more than one setting runs the drafter here, each is built and its pass of `SLOTS` drafts timed,
in turn for `ROUNDS` rounds so that load elsewhere hits them alike, and the fastest is kept. The
choice is cached per machine, target precision, drafter and draft options under
$DCOCO_CACHE_DIR/profiles/ (`dcoco profile --refresh` removes it with the rest), so the first run
pays about a second per setting and later runs read it. One line on stderr says what was chosen
and from what. The draft head's correction is not timed: the candidates differ in the drafter's
layers and LM head, and compiling a head for each would cost minutes.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from dcoco.decode.cost_curve import machine_fingerprint, measure_draft
from dcoco.decode.draft_precision import HALF, PLAIN_HEADS, quantised_widths_fit
from dcoco.decode.proposers import Proposer
from dcoco.models.cpu.cpu_kernels import kernels_state
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.target.int4_dot import int4_dot_available
from dcoco.models.target.packed_linear import native_bf16
from dcoco.models.target.target import TargetModel
from dcoco.paths import cache_dir

# Bumped when the drafter's pass changes what a draft costs, so that choices cached before it are
# made again (2: dcoco.models.drafter.draft_pass, int4 drafters, drafted blocks; 3: w4a8 drafters;
# 4: the w4a8 MLP in one call, the attention in place, the copy bonus in C++; 5: w4a8 in AVX2,
# the draft dtype measured).
DRAFT_PASS = 5
SLOTS = 4  # drafts a timed pass proposes (or the drafter's most, where fewer)
ROUNDS = 3
PREFIX = "draft-dtype-"  # the cached choices' file names


def candidates(target: TargetModel, config: DrafterConfig) -> list[str]:
    """The settings that run this drafter beside `target` here: none to weigh off a CPU or
    beside an fp32 target (its own dtype); the target's bf16 only where bf16 is native."""
    if target.device.type != "cpu" or target.dtype not in HALF:
        return ["target"]
    settings = ["target"] if native_bf16() else []
    if isinstance(target.lm_head, PLAIN_HEADS):
        settings.append("fp32")
    if quantised_widths_fit(config):
        settings += ["int4", "w4a8"] if int4_dot_available() else ["int4"]
    return settings or ["target"]


def measured_setting(target: TargetModel, config: DrafterConfig, key: dict,
                     build: Callable[[str], Proposer],
                     label: str = "the drafter") -> str:  # fmt: skip
    """The fastest of `candidates` for the drafter `config` (cached under `key`: its checkpoint's
    config and what else its cost depends on); `build(setting)` makes the proposer whose pass is
    timed; `label` names it in the line that reports the choice."""
    settings = candidates(target, config)
    if len(settings) == 1:
        return settings[0]
    path = _choice_path(target, config, key)
    if path.is_file():
        try:
            chosen = json.loads(path.read_text())["draft_dtype"]
            if chosen in settings:
                return chosen
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: measure again
    slots = min(SLOTS, config.block_size - 1)
    proposers = {setting: build(setting) for setting in settings}
    samples: dict[str, list[float]] = {setting: [] for setting in settings}
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for setting, proposer in proposers.items():
                samples[setting].append(measure_draft(target, proposer, slots, repeats=3)[0])
    ms = {setting: round(statistics.median(values), 2) for setting, values in samples.items()}
    chosen = min(ms, key=ms.get)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"draft_dtype": chosen, "draft_ms": ms, "slots": slots}, indent=1))
    timed = ", ".join(f"{setting} {value:.2f} ms" for setting, value in ms.items())
    print(f"dcoco: draft dtype auto -> {chosen} for {label} beside {target.precision} (a pass of "
          f"{slots} drafts: {timed}; measured once on this machine)", file=sys.stderr)  # fmt: skip
    return chosen


def forget_draft_settings() -> int:
    """Remove every cached choice (`dcoco profile --refresh`): the next build measures again.
    Returns how many there were."""
    paths = list((cache_dir() / "profiles").glob(f"{PREFIX}*.json"))
    for path in paths:
        path.unlink(missing_ok=True)
    return len(paths)


def _choice_path(target: TargetModel, config: DrafterConfig, key: dict) -> Path:
    record = {
        **machine_fingerprint(),
        **key,
        "target": target.name,
        "precision": str(target.precision),
        "cpu_kernels": kernels_state(),
        "draft_pass": DRAFT_PASS,
    }
    digest = hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()
    return cache_dir() / "profiles" / f"{PREFIX}{target.name}-{digest[:16]}.json"
