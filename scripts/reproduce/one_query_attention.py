"""What one query row's attention costs on this CPU by kernel: the `rowwise` kernel's choice.

The `rowwise` attention (dcoco.models.target.rowwise_attention) runs a decoding step, and every row
of a verify, as one query over the keys it may see. In bf16 it calls SDPA, or, on a CPU without AMX,
upcasts q, K and V and calls SDPA's fp32 kernel. This times one SmolLM2 layer's shapes (9 query
heads, 3 K/V heads, head_dim 64) over 300 and 1,000 keys, call after call in turn:

- `bf16 sdpa`: SDPA on the bf16 rows (what AMX machines run);
- `fp32 sdpa`: SDPA on rows already in fp32 (the floor of the fp32 path);
- `upcast + fp32 sdpa`: bf16 rows upcast, SDPA in fp32, rounded back (the path on other CPUs);
- `upcast + three ops`: the same product as q Kᵀ, softmax, P V (the path before 2026-12-06).

Measured 2026-12-06 on 2 cores of an AMD EPYC Zen 4 (AVX-512 bf16, no AMX), four runs, 300 /
1,000 keys: bf16 sdpa 175-300 / 540-990 µs, fp32 sdpa 32-43 / 78-128, upcast + fp32 sdpa 58-98 /
131-238, upcast + three ops 65-121 / 150-270.

Usage: .venv/bin/python scripts/reproduce/one_query_attention.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dcoco.decode.cost_curve import interleaved_ms, machine_fingerprint

HEADS, KV_HEADS, HEAD_DIM, SCALE, REPEATS = 9, 3, 64, 0.125, 300


def kernels(keys: int) -> dict:
    """name -> a call computing one query row's attention over `keys` keys."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, HEADS, 1, HEAD_DIM, generator=generator).bfloat16()
    key, value = (
        torch.randn(1, KV_HEADS, keys, HEAD_DIM, generator=generator).bfloat16() for _ in range(2)
    )
    q32, k32, v32 = query.float(), key.float(), value.float()

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=SCALE, enable_gqa=True)

    def three_ops():
        grouped = query.float().view(1, KV_HEADS, -1, HEAD_DIM)
        weights = torch.matmul(grouped, key.float().transpose(-1, -2)) * SCALE
        return torch.matmul(torch.softmax(weights, -1), value.float()).bfloat16()

    return {
        "bf16 sdpa": lambda: sdpa(query, key, value),
        "fp32 sdpa": lambda: sdpa(q32, k32, v32),
        "upcast + fp32 sdpa": lambda: sdpa(query.float(), key.float(), value.float()).bfloat16(),
        "upcast + three ops": three_ops,
    }


def main() -> None:
    machine = machine_fingerprint()
    cpu, isa, threads = machine["cpu"], machine["isa"], machine["threads"]
    print(f"{cpu} ({isa}), {threads} threads, torch {machine['torch']}")
    print("| kernel | 300 keys µs | 1,000 keys µs |\n|---|--:|--:|")
    columns = [interleaved_ms(list(kernels(keys).values()), REPEATS) for keys in (300, 1000)]
    for index, name in enumerate(kernels(1)):
        print(f"| {name} | {columns[0][index] * 1000:.1f} | {columns[1][index] * 1000:.1f} |")


if __name__ == "__main__":
    main()
