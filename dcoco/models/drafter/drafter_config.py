"""A block drafter's shape (DrafterConfig) and the checks that it is well-formed and fits a target.

The config is what a drafter checkpoint's config.json stores beside the DFlash names vLLM reads
(dcoco.models.drafter.drafter_io); the model itself is dcoco.models.drafter.drafter.BlockDrafter.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcoco.errors import DcocoError

DEFAULT_NUM_TAPS = 3


def build_target_layer_ids(num_target_layers: int, num_taps: int) -> tuple[int, ...]:
    """DFlash's tap rule: one tap -> the middle layer; else spread evenly over layers 1 .. L-3."""
    if num_taps == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_taps - 1)) for i in range(num_taps))


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    num_layers: int = 2
    block_size: int = 16
    copy_hints: bool = (
        False  # mask slots read prompt lookup's tokens (dcoco.models.drafter.copy_hints)
    )
    copy_gate: bool = False  # a learnt bonus on each hinted slot's hint logit (needs copy_hints)

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def for_target(
        cls,
        target,
        num_layers: int = 2,
        block_size: int = 16,
        mask_token_id: int | None = None,
        target_layer_ids: tuple[int, ...] | None = None,
        num_taps: int = DEFAULT_NUM_TAPS,
    ) -> DrafterConfig:
        """A drafter shaped like `target` (a TargetModel or a Hugging Face config).

        The mask id must be a real row of the target's embedding that the target never emits (for
        SmolLM2: 16, an unused special token), so it has no default.
        """
        hf = getattr(target, "config", target)
        info = getattr(target, "info", None)
        num_target_layers = info.num_layers if info else hf.num_hidden_layers
        vocab_size = info.vocab_size if info else hf.vocab_size
        if mask_token_id is None:
            raise DcocoError("a drafter needs a mask token id: an unused row of the target vocab")
        rope = getattr(hf, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(hf, "rope_theta", None))
        if rope_theta is None:
            raise DcocoError("the target config has no rope_theta to copy into the drafter")
        taps = target_layer_ids or build_target_layer_ids(num_target_layers, num_taps)
        config = cls(
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_heads=hf.num_attention_heads,
            num_kv_heads=hf.num_key_value_heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
            rms_norm_eps=float(hf.rms_norm_eps),
            rope_theta=float(rope_theta),
            max_position_embeddings=hf.max_position_embeddings,
            vocab_size=vocab_size,
            mask_token_id=mask_token_id,
            target_layer_ids=tuple(int(t) for t in taps),
            num_target_layers=num_target_layers,
            num_layers=num_layers,
            block_size=block_size,
        )
        check_self_consistent(config)
        return config


def check_self_consistent(config: DrafterConfig) -> None:
    if config.block_size < 2:
        raise DcocoError(f"block size must be >= 2 (an anchor and a slot), got {config.block_size}")
    if config.num_layers < 1 or not config.target_layer_ids:
        raise DcocoError("a drafter needs at least one layer and one target tap")
    if config.copy_gate and not config.copy_hints:
        raise DcocoError("a copy gate reads copy hints: it needs copy_hints too")
    if not 0 <= config.mask_token_id < config.vocab_size:
        raise DcocoError(
            f"mask token id {config.mask_token_id} is outside the vocab (size {config.vocab_size})"
        )


def check_compatible(config: DrafterConfig, target_info, fingerprint: str | None = None) -> None:
    """Raise DcocoError unless a drafter with `config` can run on the target described by
    `target_info` (a TargetInfo); `fingerprint` is the one stored with the drafter, if any."""
    check_self_consistent(config)
    checks = [
        ("vocab size", config.vocab_size, target_info.vocab_size),
        ("hidden size", config.hidden_size, target_info.hidden_size),
        ("number of target layers", config.num_target_layers, target_info.num_layers),
    ]
    for what, mine, theirs in checks:
        if mine != theirs:
            raise DcocoError(
                f"drafter does not fit target '{target_info.name}': {what} is {mine} for the "
                f"drafter but {theirs} for the target"
            )
    bad = [t for t in config.target_layer_ids if not 0 <= t < target_info.num_layers]
    if bad:
        raise DcocoError(
            f"drafter taps {bad} do not exist: target '{target_info.name}' has "
            f"{target_info.num_layers} layers"
        )
    if fingerprint and fingerprint != target_info.fingerprint:
        raise DcocoError(
            f"drafter was trained on a different target (fingerprint {fingerprint}, target "
            f"'{target_info.name}' has {target_info.fingerprint})"
        )
