"""The DCOCO corrector's prefix-first walk as one C++ call (dcoco/models/cpu/corrector_walk.cpp).

Eagerly `Corrector.select` is some 300 small operators; compiled by inductor it still cost 1.3 ms
at 4 slots on a 2-core Zen 4 (`dcoco profile`), for about 2 M multiply-adds. The fused call does
the same walk: the top-K and log normaliser of each slot's logits, the candidates' representations
and features, the products over every candidate as one matmul each, then one row of S per slot
pair, S[p, k[p], :], for the candidate k[p] the walk chose (K scores per slot, not K x K). The
batched K x K form stays for training, for the path rules, and for GPUs.

It computes in fp32 from fp32 copies of the corrector's weights and vocabulary tables, made once
here (a corrector kept in bf16 walks in fp32 too); a product's matrix that bf16 holds exactly, as
a checkpoint's does, is kept in bf16 and widened as it is read (the same products, from half the
bytes: in decoding they come from memory). Its picks equal the batched fp32 walk's except
where two scores are within rounding of each other (tests/test_fused_walk.py); a draft is verified
whatever it picks, so output is unchanged. Our engine uses it on a CPU where the kernels build,
and so does a CPU server's vLLM worker, which builds them in a thread (head_compile.HeadSelect).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcoco.models.cpu import cpu_kernels
from dcoco.models.heads.corrector import Corrector
from dcoco.models.heads.selection import DEFAULT_SELECTION, WALKS, split_selection

# the products' weights (few_rows.h reads them in fp32 or bf16, by blocks of BLOCK outputs)
BLOCK = 32
MATRICES = ("slot_w", "pair_w", "delta_pair", "delta_from", "delta_to", "query_pair", "query_from")


class FusedWalk:
    """`walk(hidden, logits, anchor_ids)` -> token ids [batch, slots], the corrector's walk named
    by `selection` over logits whose columns are `column_ids` (None: token ids)."""

    def __init__(self, corrector: Corrector, selection: str | None, column_ids: Tensor | None):
        rule, top_k = split_selection(selection or DEFAULT_SELECTION)
        config = corrector.config
        self.top_k, self.trained_top_k = top_k or config.top_k, config.top_k
        self.from_start = WALKS[rule]
        self.normalised, self.anchor = config.features == "normalised", config.anchor
        empty = torch.empty(0, dtype=torch.long)
        self.column_ids = empty if column_ids is None else column_ids.long().contiguous()
        self.query_scale = config.hidden_size**-0.5
        self.weights = fp32_weights(corrector)

    def __call__(self, hidden: Tensor, logits: Tensor, anchor_ids: Tensor) -> Tensor:
        """hidden [batch, slots, hidden], logits [batch, slots, columns], anchor_ids [batch]."""
        return cpu_kernels.kernels().corrector_walk(
            logits.float().contiguous(), hidden.float().contiguous(),
            anchor_ids.long().contiguous(), self.column_ids, self.weights, self.top_k,
            self.trained_top_k, self.normalised, self.anchor, self.from_start, self.query_scale,
        )  # fmt: skip


def fused_walk_for(head, selection: str | None, column_ids: Tensor | None) -> FusedWalk | None:
    """A FusedWalk for `head` where it can run one: a DCOCO corrector on a CPU, a walking rule
    (`greedy`, `keep1`, with or without /K), and the kernels built here; else None."""
    if getattr(head, "kind", None) != "dcoco":
        return None
    rule, _ = split_selection(selection or DEFAULT_SELECTION)
    if rule not in WALKS or head.delta_in.weight.device.type != "cpu":
        return None
    if cpu_kernels.kernels() is None:
        return None
    return FusedWalk(head, selection, column_ids)


@torch.no_grad()
def fp32_weights(corrector: Corrector) -> dict[str, Tensor]:
    """The corrector's weights by the names corrector_walk.cpp reads, fp32 and contiguous; delta's
    first layer split by input block ([s_p ; z_a f_a ; z_b f_b]), the query's by [s_p ; z_a]."""
    width = corrector.config.mlp_hidden
    features = corrector.delta_in.weight.shape[1] - 3 * width
    delta_pair, delta_from, delta_to = corrector.delta_in.weight.split(
        [width, width + features // 2, width + features // 2], dim=1
    )
    weights = {
        "slot_w": corrector.slot_proj.weight, "slot_b": corrector.slot_proj.bias,
        "cand_ln_w": corrector.candidate_norm.weight, "cand_ln_b": corrector.candidate_norm.bias,
        "delta_pair": delta_pair, "delta_from": delta_from, "delta_to": delta_to,
        "delta_b": corrector.delta_in.bias,
        "out_w": corrector.delta_out.weight[0], "out_b": corrector.delta_out.bias,
        "candidate_eps": torch.tensor([corrector.candidate_norm.eps]),
    }  # fmt: skip
    if corrector.pair is not None:
        linear, norm = corrector.pair[0], corrector.pair[1]
        weights |= {"pair_w": linear.weight, "pair_b": linear.bias, "pair_ln_w": norm.weight,
                    "pair_ln_b": norm.bias, "pair_eps": torch.tensor([norm.eps])}  # fmt: skip
    embedding = corrector._shared[0].weight.float()
    if corrector.token_proj is not None:
        weights["token_table"] = _tabled(
            corrector, "_token_table", embedding, corrector.token_proj.weight.float().t()
        )
    if corrector.config.successor_query:
        query_pair, query_from = corrector.query_in.weight.split([width, width], dim=1)
        successors = _tabled(
            corrector, "_successor_table", embedding, corrector.query_out.weight.float()
        )
        weights |= {"query_pair": query_pair, "query_from": query_from,
                    "query_b": corrector.query_in.bias, "successors": successors}  # fmt: skip
    if corrector.config.pair_counts:
        counts = corrector.pair_counts
        weights |= {"codes": counts.codes.long(), "log_probs": counts.log_probs,
                    "unseen": counts.unseen, "bigram_in": corrector.bigram_in,
                    "bigram_scale": corrector.bigram_scale}  # fmt: skip
    return {name: _stored(name, tensor.detach()) for name, tensor in weights.items()}


def _stored(name: str, tensor: Tensor) -> Tensor:
    """A weight as corrector_walk.cpp reads it: a product's matrix by blocks, in bf16 where bf16
    holds it exactly (a corrector loaded from a checkpoint, stored in bf16: half the bytes from
    memory for the same products), else fp32; the pair codes int64."""
    if name == "codes":
        return tensor.long().contiguous()
    tensor = tensor.float()
    if name not in MATRICES:
        return tensor.contiguous()
    # [blocks, in, BLOCK]: few_rows.h reads each block of BLOCK outputs as one stream
    outputs, inputs = tensor.shape
    padded = torch.zeros(-(-outputs // BLOCK) * BLOCK, inputs).index_copy_(
        0, torch.arange(outputs), tensor
    )
    blocked = padded.view(-1, BLOCK, inputs).transpose(1, 2).contiguous()
    if torch.equal(blocked.bfloat16().float(), blocked):
        return blocked.bfloat16()
    return blocked


def _tabled(corrector: Corrector, name: str, embedding: Tensor, projection: Tensor) -> Tensor:
    """The fp32 vocabulary table embedding [vocab, hidden] @ projection [hidden, width]
    (token_proj's, or W_q2's successor side): the corrector's own where it built one in fp32
    (prepare_inference; not a second copy of its 50 MB), else made here in chunks of rows."""
    built = getattr(corrector, name).table
    if built is not None and built.dtype == torch.float32:
        return built
    return torch.cat([rows @ projection for rows in embedding.split(4096)])
