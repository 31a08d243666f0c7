"""What a recipe will cost before it runs (`dcoco recipe FILE --dry-run`): the target and the
drafter built on the meta device (shapes, no memory, no weights), their parameter counts, the
memory one GPU holds at the recipe's batch, the feature cache per corpus token, and the steps.

Memory per GPU (data parallel: every GPU holds the target and the drafter). The trainer takes a
step's records `records-per-forward` (R) at a time and each record's anchors `anchor-chunk`
blocks at a time, adding up the gradients, so what a step holds beyond the weights is one
forward's:
- target weights in the recipe's `target-dtype`;
- the drafter's fp32 weights, fp32 gradients and AdamW's two fp32 moments: 16 bytes a parameter;
- R records' target features, bf16: R x `max-seq-len` x taps x hidden x 2;
- one forward's loss logits in fp32 and their gradient: R x `anchor-chunk` x (block - 1) x
  `loss-vocab` (or the vocabulary) x 8;
- the draft layers' activations, estimated as R x `anchor-chunk` x block x (12 x hidden + 3 x
  intermediate) x layers x 2 bytes (bf16 autocast; the attention over the context on top).
The feature cache holds taps x hidden bf16 values a corpus token. Estimates for planning, not
measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig

GIB = 1 << 30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Plan:
    target_params: int
    drafter_params: int  # trained: the shared embedding and LM head not counted
    memory_gib: dict[str, float]  # per GPU, by part
    cache_bytes_per_token: int
    steps: int

    def lines(self) -> list[str]:
        parts = ", ".join(f"{name} {gib:.2f}" for name, gib in self.memory_gib.items())
        return [
            f"target   {self.target_params / 1e9:.2f} B parameters (meta device)",
            f"drafter  {self.drafter_params / 1e6:.1f} M trained parameters (meta device)",
            f"memory   {sum(self.memory_gib.values()):.1f} GiB per GPU (estimate: {parts})",
            f"cache    {self.cache_bytes_per_token / 1024:.1f} KiB a corpus token "
            f"({self.cache_bytes_per_token * 1e9 / 2**40:.1f} TiB per billion tokens)",
            f"steps    {self.steps:,}",
        ]


def meta_target(target_config: dict) -> nn.Module:
    """The target as transformers builds it from its config, on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(target_config)
    try:
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    except (KeyError, ValueError) as error:
        raise DcocoError(f"the recipe's [target_config] is not a model config ({error})") from None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def plan(target_config: dict, first_stage_flags: dict, stage_flags: list[dict]) -> Plan:
    """The plan of a recipe whose first stage trains a fresh drafter with `first_stage_flags`."""
    target = meta_target(target_config)
    flags = first_stage_flags
    drafter_config = DrafterConfig.for_target(
        target.config,
        num_layers=int(flags.get("num-layers", 2)),
        block_size=int(flags.get("block-size", 16)),
        mask_token_id=int(flags.get("mask-token-id", -1)),
        target_layer_ids=tuple(flags["taps"]) if flags.get("taps") else None,
    )
    with torch.device("meta"):
        drafter = BlockDrafter(
            drafter_config, target.get_input_embeddings(), target.get_output_embeddings()
        )
    target_params = sum(p.numel() for p in target.parameters())
    shared = {id(p) for p in (*drafter._shared[0].parameters(), *drafter._shared[1].parameters())}
    trained = sum(p.numel() for p in drafter.parameters() if id(p) not in shared)
    return Plan(
        target_params=target_params,
        drafter_params=trained,
        memory_gib=_memory(target_params, trained, drafter_config, flags),
        cache_bytes_per_token=drafter_config.num_taps * drafter_config.hidden_size * 2,
        steps=sum(int(f.get("max-steps", 0)) for f in stage_flags),
    )


def _memory(target_params: int, trained: int, config: DrafterConfig, flags: dict):
    records = int(flags.get("records-per-forward", 1))
    chunk = records * int(flags.get("anchor-chunk", 32))  # blocks in one forward
    vocab = int(flags.get("loss-vocab", 16000)) or config.vocab_size
    hidden, block = config.hidden_size, config.block_size
    layer_width = 12 * hidden + 3 * config.intermediate_size
    dtype = flags.get("target-dtype", "fp32")
    if dtype not in DTYPE_BYTES:
        raise DcocoError(f"target-dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    return {
        "target": target_params * DTYPE_BYTES[dtype] / GIB,
        "drafter+adam": trained * 16 / GIB,
        "features": records
        * int(flags.get("max-seq-len", 1024))
        * config.num_taps
        * hidden
        * 2
        / GIB,
        "logits": chunk * (block - 1) * vocab * 8 / GIB,
        "activations": chunk * block * layer_width * config.num_layers * 2 / GIB,
    }
