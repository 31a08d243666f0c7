"""The corrector's K x K grid: delta[p, a, b] = w . silu(pair[p] + from[p, a] + to[p, b] + ...).

Every slot pair holds K x K pre-activations of width mlp_hidden, so a drafted block of 8 slots at
K = 16 and width 256 is 1.8 M numbers per request: at 16 requests the broadcast sum and its
temporaries (one per term, then silu) stream over a hundred megabytes through memory for a
result of 28 K scores. Training needs that graph for autograd. Inference does not, so it fills
one cache-sized buffer a few slot pairs at a time, in place, in the same order of operations:
the scores are bit-identical to the broadcast form's (tests/test_pair_grid.py). The buffer
outlives the call (`GridScratch`, one per corrector): fresh memory of this size costs a page
fault per 4 KiB on first write, which made a write into it about 6x slower than into a reused
one (measured on an AVX2 Zen 3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Grid numbers per chunk at inference: 2 MiB of fp32, about what a core's L2 cache holds.
CHUNK_NUMBERS = 1 << 19


class GridScratch:
    """A reusable flat buffer for the inference grid, grown on demand, never in a state_dict."""

    def __init__(self) -> None:
        self._buffer: Tensor | None = None

    def take(self, numbers: int, like: Tensor) -> Tensor:
        buffer = self._buffer
        # A buffer made in inference mode (the engine's) takes no in-place writes outside it.
        if (
            buffer is None
            or buffer.numel() < numbers
            or (buffer.dtype, buffer.device) != (like.dtype, like.device)
            or (buffer.is_inference() and not torch.is_inference_mode_enabled())
        ):
            buffer = self._buffer = like.new_empty(numbers)
        return buffer[:numbers]


def delta_grid(
    pair: Tensor,
    from_pre: Tensor,
    to_pre: Tensor,
    delta_out: nn.Linear,
    counted: Tensor | None = None,
    counted_in: Tensor | None = None,
    scratch: GridScratch | None = None,
) -> Tensor:
    """delta [batch, pairs, K, K] fp32 from the first layer's three parts: pair [batch, pairs,
    width] (its bias included), from_pre [batch, pairs, K, width] (candidate a at slot p), to_pre
    [batch, pairs, K, width] (candidate b at slot p + 1). `counted` [batch, pairs, K, K] enters
    the hidden layer through the vector `counted_in` [width]. `scratch` keeps the inference
    buffer between calls (None: a new one)."""
    # Compiled (dcoco.models.heads.head_compile), the broadcast form too: inductor fuses it into one
    # pass, and the chunk loop would compile a graph per batch size.
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        pre = pair[:, :, None, None] + from_pre[:, :, :, None] + to_pre[:, :, None, :]
        if counted is not None:
            pre = pre + counted[..., None] * counted_in
        return delta_out(F.silu(pre)).squeeze(-1).float()
    scratch = scratch or GridScratch()
    return _chunked(pair, from_pre, to_pre, delta_out, counted, counted_in, scratch)


def _chunked(pair, from_pre, to_pre, delta_out, counted, counted_in, scratch) -> Tensor:
    batch, pairs, top_k, width = from_pre.shape
    rows = batch * pairs
    pair, from_pre, to_pre = (
        pair.reshape(rows, width),
        from_pre.reshape(rows, top_k, width),
        to_pre.reshape(rows, top_k, width),
    )
    step = max(1, min(rows, CHUNK_NUMBERS // (top_k * top_k * width)))
    numbers = step * top_k * top_k * width
    buffer = scratch.take(2 * numbers if counted is not None else numbers, from_pre)
    grid = buffer[:numbers].view(step, top_k, top_k, width)  # reused by every chunk
    term = buffer[numbers:].view(grid.shape) if counted is not None else None
    delta = torch.empty(rows, top_k, top_k, dtype=torch.float32, device=pair.device)
    for start in range(0, rows, step):
        end = min(rows, start + step)
        block, shape = grid[: end - start], (end - start, top_k, top_k, width)
        # (pair + from) + to, then + counted term: the broadcast form's order, so equal bits.
        first = from_pre[start:end, :, None].expand(shape)
        torch.add(first, pair[start:end, None, None], out=block)
        block.add_(to_pre[start:end, None, :])
        if counted is not None:
            scaled = counted.reshape(rows, top_k, top_k)[start:end, ..., None].expand(shape)
            block.add_(torch.mul(scaled, counted_in, out=term[: end - start]))
        F.silu(block, inplace=True)
        delta[start:end] = delta_out(block).squeeze(-1)
    return delta.view(batch, pairs, top_k, top_k)
