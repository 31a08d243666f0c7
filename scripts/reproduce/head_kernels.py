"""What the 49,152-row LM head costs by row count on each CPU kernel torch offers for it.

A step runs the head over 1 row, a verify of k drafts over k + 1, the drafter over the slots it
drafts. The weight is SmolLM2's shape (49,152 x 576) with random values (the cost does not read
them): fp32 through aten and through oneDNN with prepacked weights, bf16 through aten, int8 per
row (`_weight_int8pack_mm`) and 4-bit groups of 32 (`_weight_int4pack_mm_for_cpu`, the kernel
gguf's linear layers run on). The kernels run in alternation, call after call. Prints median ms
of REPEATS calls; ratios are within this one run.

Usage: .venv/bin/python scripts/reproduce/head_kernels.py [ROWS,...]   (default: 1,2,4,8)
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from dcoco.decode.cost_curve import interleaved_ms, machine_fingerprint, ms_table

VOCAB, HIDDEN, GROUP, REPEATS = 49152, 576, 32, 15


def kernels(weight: torch.Tensor, rows: int) -> dict:
    """name -> a call computing rows x weight^T on that kernel."""
    x = torch.randn(rows, HIDDEN)
    x16 = x.bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
    w16 = weight.bfloat16()
    scale = weight.abs().amax(1) / 127
    w8 = torch.round(weight / scale[:, None]).to(torch.int8)
    groups = weight.reshape(VOCAB, HIDDEN // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    step = (high - low) / 15
    codes = torch.round((groups - low[..., None]) / step[..., None]).clamp(0, 15)
    w4 = torch._convert_weight_to_int4pack_for_cpu(codes.reshape(VOCAB, HIDDEN).int(), 2)
    scales_and_zeros = torch.stack([step.T, (low + 8 * step).T], -1).bfloat16().contiguous()
    return {
        "fp32 aten": lambda: F.linear(x, weight),
        "fp32 onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "bf16 aten": lambda: F.linear(x16, w16),
        "int8 per row": lambda: torch._weight_int8pack_mm(x16, w8, scale.bfloat16()),
        "int4 groups": lambda: torch._weight_int4pack_mm_for_cpu(x16, w4, GROUP, scales_and_zeros),
    }


def main(row_counts: list[int]) -> None:
    machine = machine_fingerprint()
    print(f"{machine['cpu']} ({machine['isa']}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; ms for rows x [{VOCAB} x {HIDDEN}]^T")  # fmt: skip
    weight = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0)) * 0.05
    table: dict[str, list[float]] = {}
    for rows in row_counts:
        calls = kernels(weight, rows)
        for name, ms in zip(calls, interleaved_ms(list(calls.values()), REPEATS, 3), strict=True):
            table.setdefault(name, []).append(ms)
    print(ms_table("kernel", [f"{rows} rows" for rows in row_counts], table))


if __name__ == "__main__":
    main([int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4,8").split(",")])
