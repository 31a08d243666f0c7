"""The w4a8 products (dcoco.models.target.int4_dot): the packing holds the int4 layer's weights, the
kernel computes the int8-rounded rows' product as a reference written with torch does, each row
alone, and the layer keeps torch's int4 kernel where the kernel does not serve."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from dcoco.models.cpu.cpu_info import cpu_info
from dcoco.models.cpu.cpu_kernels import ARCH, kernels
from dcoco.models.target import int4_dot
from dcoco.models.target.gguf_weights import GROUP, Int4GroupLinear, dequantise
from dcoco.models.target.int4_dot import (
    LANES,
    Int4DotLinear,
    all_w4a8,
    int4_dot_available,
    int4_dot_isa,
    pack,
    w4a8_linear,
)
from dcoco.models.target.int4_groups import quantise_int4
from dcoco.models.target.layer_loop import rotate

needs_kernel = pytest.mark.skipif(not int4_dot_available(), reason="no int4_dot build here")


def layer_weights(out_features: int, in_features: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return quantise_int4(torch.randn(out_features, in_features, generator=generator) * 0.05)


def unpack(weights, scales, zeros):
    """The packed layout read back: codes [out, in], scale and zero [out, in / 32]."""
    blocks, eighths = weights.shape[:2]
    low, high = (weights & 0x0F).int(), (weights >> 4).int()  # [blocks, in / 8, lane, 4]
    codes = torch.stack([low, high], dim=3).permute(0, 2, 1, 3, 4).reshape(blocks * LANES, -1)
    per_output = [t.transpose(1, 2).reshape(blocks * LANES, -1) for t in (scales, zeros)]
    assert codes.shape[1] == eighths * 8
    return codes, *per_output


def reference(x, codes, scale, zero):
    """The kernel's arithmetic in torch: rows rounded to int8 per group, exact integer sums."""
    rows, groups = x.shape[0], x.shape[1] // GROUP
    values = x.float().view(rows, groups, GROUP)
    amax = values.abs().amax(-1)
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    rounded = torch.round(values * inverse[..., None])  # half to even, as nearbyint
    centred = (codes.float() - 8).view(codes.shape[0], groups, GROUP)
    dots = torch.einsum("rgi,ngi->rng", rounded, centred)  # exact: |sum| < 2^15
    scale, zero = scale.half().float(), zero.half().float()
    return (dots * scale * (amax / 127)[:, None]).sum(-1) + values.sum(-1) @ zero.T


def test_packing_keeps_every_weight_and_pads_whole_blocks():
    codes, scale, zero = layer_weights(40, 64)
    weights, scales, zeros = pack(codes, scale, zero)
    assert weights.shape == (3, 64 // 8, LANES, 4) and scales.shape == (3, 64 // GROUP, LANES)
    read_codes, read_scale, read_zero = unpack(weights, scales, zeros)
    assert torch.equal(read_codes[:40], codes)
    assert torch.equal(read_codes[40:], torch.full((8, 64), 8, dtype=torch.int32))  # weights 0
    assert torch.equal(read_scale[:40], scale.half()) and torch.equal(read_zero[:40], zero.half())


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
def test_the_kernel_computes_the_rounded_rows_product(rows):
    codes, scale, zero = layer_weights(48, 96, seed=rows)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1)).bfloat16()
    x[0, :GROUP] = 0  # a group of zeros rounds to scale 0
    w4a8 = Int4DotLinear(codes, scale, zero)(x)
    assert w4a8.dtype == torch.bfloat16 and w4a8.shape == (rows, 48)
    expected = reference(x, codes, scale, zero)
    # fp32 sums in another order, then one bf16 rounding
    assert torch.allclose(w4a8.float(), expected, rtol=2**-7, atol=1e-3)
    exact = x.float() @ dequantise(codes, scale, zero).T
    assert (w4a8.float() - exact).norm() / exact.norm() < 0.015  # the int8 rows' rounding


@needs_kernel
def test_fp32_rows_are_rounded_as_their_values_are():
    codes, scale, zero = layer_weights(48, 96)
    layer = Int4DotLinear(codes, scale, zero)
    x = torch.randn(5, 96).bfloat16()
    assert torch.equal(layer(x.float()), layer(x))  # the same values, read from either dtype
    uneven = torch.randn(3, 96)
    uneven[0, 0], uneven[1, 40] = 1e4, -1e-4  # one input dwarfs its group; one group all tiny
    uneven[1, 32:64] *= 1e-6
    expected = reference(uneven, codes, scale, zero)
    assert torch.allclose(layer(uneven).float(), expected, rtol=2**-7, atol=1e-3)


@needs_kernel
def test_each_row_is_computed_alone():
    layer = w4a8_linear(torch.randn(32, 64) * 0.05)
    x = torch.randn(12, 64).bfloat16()
    together = layer(x)
    for row in range(12):
        assert torch.equal(layer(x[row : row + 1])[0], together[row])


@needs_kernel
def test_the_fused_equals_its_operators():
    width, n = 96, 64
    gate_up, down = (
        w4a8_linear(torch.randn(2 * width, n) * 0.1),
        w4a8_linear(torch.randn(n, width) * 0.1),
    )
    assert all_w4a8(gate_up, down) and not all_w4a8(gate_up, torch.nn.Linear(width, n))
    norm = (1 + 0.1 * torch.randn(n)).bfloat16()
    hidden = torch.randn(7, n).bfloat16()
    gate, up = gate_up(kernels().rms_norm(hidden, norm, 1e-5)).split(width, dim=-1)
    expected = hidden + down(F.silu(gate) * up)
    fused = int4_dot.mlp(hidden, norm, 1e-5, gate_up, down, width)
    # silu's exp may round a value to the neighbouring bf16 (vector_math.h); nothing else differs
    assert (fused != expected).float().mean() < 0.01
    assert torch.allclose(fused.float(), expected.float(), rtol=2**-6, atol=2**-6)


@needs_kernel
def test_the_fused_qkv_equals_its_operators():
    """q|k|v of [context; norm(hidden)], q's and k's heads normed and rotated: bit for bit."""
    generator = torch.Generator().manual_seed(5)
    layer = w4a8_linear(torch.randn(5 * 64, 96, generator=generator) * 0.1)  # 3 q, 1 k, 1 v
    hidden, context = (torch.randn(n, 96, generator=generator).bfloat16() for n in (4, 3))
    norm, qk_norm = (
        (1 + 0.1 * torch.randn(96)).bfloat16(),
        (1 + 0.1 * torch.randn(4, 64)).bfloat16(),
    )
    angles = torch.arange(7.0)[:, None] * torch.linspace(0.01, 1.0, 32)
    cos = torch.cat([angles.cos()] * 2, -1).bfloat16()[:, None]
    signed_sin = torch.cat([-angles.sin(), angles.sin()], -1).bfloat16()[:, None]
    qk, heads = int4_dot.qkv(hidden, context, norm, 1e-5, layer, qk_norm, cos, signed_sin)
    joined = torch.cat([context, kernels().rms_norm(hidden, norm, 1e-5)])
    expected_heads = layer(joined).view(7, 5, 64)
    expected_qk = rotate(expected_heads[:, :4], cos, signed_sin, norm=qk_norm, eps=1e-5)
    assert torch.equal(heads, expected_heads) and torch.equal(qk, expected_qk)


@needs_kernel
def test_prefills_take_the_dequantised_copy():
    codes, scale, zero = layer_weights(32, 64)
    layer, int4 = Int4DotLinear(codes, scale, zero), Int4GroupLinear(codes, scale, zero)
    batched = torch.randn(2, 3, 64).bfloat16()  # a few rows in any shape: the kernel
    assert torch.equal(layer(batched), layer(batched.view(6, 64)).view(2, 3, 32))
    assert not torch.equal(layer(batched), int4(batched))
    prefill = torch.randn(1, int4_dot.MAX_ROWS + 1, 64).bfloat16()
    assert torch.equal(layer(prefill), int4(prefill))
    assert layer.weight_int4 is None  # no copy for torch's kernel


def test_the_kernel_builds_on_the_cpus_own_instructions():
    if kernels() is None:
        pytest.skip("the fused kernels did not build here")
    flags, march = cpu_info().flags, os.environ.get(ARCH, "native")
    if march == "native" and {"avx512_vnni", "avx512bw"} <= flags:
        assert int4_dot_isa() == "avx512-vnni"
    elif {"avx2", "fma", "f16c"} <= flags:  # AVX2 machines, and -march=haswell on any
        assert int4_dot_isa() == "avx2"


@pytest.mark.slow
def test_the_avx2_build_passes_these_tests():
    """On a machine with AVX-512, the AVX2 kernel (int4_dot_avx2.h, AMD Zen 3's) built with
    -march=haswell (its own build directory, about a minute) runs this file's tests."""
    if not {"avx512_vnni", "avx2", "fma", "f16c"} <= cpu_info().flags or kernels() is None:
        pytest.skip("an AVX2 machine runs this file on the AVX2 kernel itself")
    if os.environ.get(ARCH, "native") != "native":
        pytest.skip("this run is the AVX2 build's")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-rs"],
        env={**os.environ, ARCH: "haswell"}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    assert "no int4_dot build" not in run.stdout  # every kernel test ran
