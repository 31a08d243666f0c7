"""The fused CPU kernels (dcoco.models.cpu.cpu_kernels): the operators' bf16 arithmetic, served only
where they apply, and PyTorch's operators where they are off or cannot build."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from dcoco.models.cpu import cpu_kernels
from dcoco.models.target.layer_loop import rms_norm, rotate

BF16 = torch.bfloat16


@pytest.fixture
def fused():
    """The kernels, built here; a machine with a C++ compiler must build them."""
    if cpu_kernels.kernels() is None:
        if shutil.which("c++") and shutil.which("ninja"):
            pytest.fail("the fused CPU kernels did not build on a machine with c++ and ninja")
        pytest.skip("no C++ toolchain: the kernels fall back to PyTorch's operators")
    return cpu_kernels


def operators_norm(x, weight, eps):
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def operators_rotate(x, cos, signed_sin):
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def assert_within_one_step(fast, slow):
    """Equal but where an fp32 sum of squares rounds differently: then one bf16 step apart."""
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    differ = fast != slow
    assert differ.float().mean() < 1e-3
    step = slow.float().abs().clamp(min=1e-30) * 2**-7  # bf16 has 8 significant bits
    assert ((fast.float() - slow.float()).abs() <= step)[differ].all()


def test_rotation_is_the_operators_bit_for_bit(fused):
    torch.manual_seed(0)
    heads = torch.randn(5, 15, 64, dtype=BF16) * 3  # [tokens, heads, dim], q|k a strided slice
    cos, signed_sin = torch.randn(5, 1, 64, dtype=BF16), torch.randn(5, 1, 64, dtype=BF16)
    qk = heads[:, :12]
    rotated = fused.rotate(qk, cos, signed_sin)
    assert rotated.is_contiguous()
    assert torch.equal(rotated, operators_rotate(qk, cos, signed_sin))


def test_norms_are_the_operators_within_a_rounding(fused):
    torch.manual_seed(1)
    for scale in (1e-3, 1.0, 50.0):
        x = torch.randn(8, 576, dtype=BF16) * scale
        weight = torch.rand(576, dtype=BF16) + 0.5
        assert_within_one_step(fused.rms_norm(x, weight, 1e-5), operators_norm(x, weight, 1e-5))
    heads = torch.randn(3, 15, 64, dtype=BF16)[:, :12]  # per-head norms, one weight row a head
    weight = torch.rand(12, 64, dtype=BF16) + 0.5
    assert_within_one_step(fused.rms_norm(heads, weight, 1e-6),
                           operators_norm(heads, weight, 1e-6))  # fmt: skip
    cos, signed_sin = torch.randn(3, 1, 64, dtype=BF16), torch.randn(3, 1, 64, dtype=BF16)
    normed = operators_norm(heads, weight, 1e-6)
    assert_within_one_step(fused.rotate(heads, cos, signed_sin, weight, 1e-6),
                           operators_rotate(normed, cos, signed_sin))  # fmt: skip


def test_each_row_is_computed_alone(fused):
    """A k-row call computes each row as the 1-row call does (a verify's rows equal steps)."""
    torch.manual_seed(2)
    x, weight = torch.randn(6, 64, dtype=BF16), torch.rand(64, dtype=BF16)
    together = fused.rms_norm(x, weight, 1e-6)
    for row in range(6):
        assert torch.equal(together[row : row + 1], fused.rms_norm(x[row : row + 1], weight, 1e-6))


def test_kernels_serve_bf16_cpu_rows_outside_autograd_only(fused):
    rows = torch.zeros(2, 8, dtype=BF16)
    assert fused.takes(rows) and fused.takes(torch.zeros(2, 3, 8, dtype=BF16))
    assert not fused.takes(rows.float())
    assert not fused.takes(rows.clone().requires_grad_())
    assert not fused.takes(torch.zeros(1, 2, 3, 8, dtype=BF16))  # 4-D: the operators
    assert not fused.takes(torch.zeros(8, 2, dtype=BF16).T)  # last dim strided


def test_mismatched_weights_and_tables_are_refused(fused):
    heads = torch.zeros(2, 4, 8, dtype=BF16)
    tables = torch.zeros(2, 1, 8, dtype=BF16)
    with pytest.raises(RuntimeError, match="weight"):
        fused.rms_norm(heads, torch.ones(3, 8, dtype=BF16), 1e-6)  # 3 rows for 4 heads
    with pytest.raises(RuntimeError, match="weight"):
        fused.rms_norm(heads, torch.ones(6, dtype=BF16), 1e-6)
    with pytest.raises(RuntimeError, match="norm weight"):
        fused.rotate(heads, tables, tables, torch.ones(3, 8, dtype=BF16), 1e-6)
    with pytest.raises(RuntimeError, match="table row"):
        fused.rotate(heads, tables[:1], tables[:1])


def test_off_switch_and_a_failed_build_keep_the_operators(monkeypatch, capsys):
    torch.manual_seed(3)
    x, weight = torch.randn(2, 64, dtype=BF16), torch.rand(64, dtype=BF16)
    cos, signed_sin = torch.randn(2, 1, 64, dtype=BF16), torch.randn(2, 1, 64, dtype=BF16)
    heads = torch.randn(2, 4, 64, dtype=BF16)
    try:
        monkeypatch.setenv(cpu_kernels.SWITCH, "off")
        cpu_kernels.kernels.cache_clear()
        assert cpu_kernels.kernels() is None and cpu_kernels.kernels_state() == "operators"
        assert torch.equal(rms_norm(x, weight, 1e-6), operators_norm(x, weight, 1e-6))
        assert torch.equal(rotate(heads, cos, signed_sin), operators_rotate(heads, cos, signed_sin))

        monkeypatch.delenv(cpu_kernels.SWITCH)
        cpu_kernels.kernels.cache_clear()

        def broken(*args, **kwargs):
            raise RuntimeError("no compiler\nc++: command not found")

        monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
        assert cpu_kernels.kernels() is None
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == ("dcoco: fused CPU kernels unavailable, using PyTorch's operators "
                           "(c++: command not found)")  # fmt: skip
    finally:
        cpu_kernels.kernels.cache_clear()  # the next caller builds (or loads) them again


@pytest.mark.parametrize("queries, keys", [(1, 5), (2, 17), (5, 307)])
def test_draft_attention_is_softmax_attention(fused, queries, keys):
    """The draft pass's attention: SDPA's result within its own bf16 error, 9 query heads over 3
    kv heads read in place (a strided view of q|k, keys from a cache's larger buffer); any rows
    (blocks of 4) and keys (16-wide tails)."""
    generator = torch.Generator().manual_seed(queries)
    qk = torch.randn(queries, 12, 64, generator=generator).to(BF16)
    query = qk[:, :9]  # [queries, q heads, 64], strided as the draft pass hands it over
    room = torch.randn(2, 1, 3, 2 * keys, 64, generator=generator).to(BF16)
    key, value = room[0, :, :, :keys], room[1, :, :, :keys]  # strided, as the cache holds them
    if not fused.attends(query, key):
        pytest.skip("no AVX-512 bf16: the draft pass keeps SDPA")
    out = fused.draft_attention(query, key, value)
    # query head h reads kv head h // 3
    grouped = query.transpose(0, 1)[None]  # [1, 9, queries, 64]
    keys_per_head = key.repeat_interleave(3, dim=1)
    values_per_head = value.repeat_interleave(3, dim=1)
    exact = F.scaled_dot_product_attention(
        grouped.float(), keys_per_head.float(), values_per_head.float()
    )
    sdpa = F.scaled_dot_product_attention(grouped, keys_per_head, values_per_head)
    assert out.dtype == BF16 and out.shape == (queries, 9 * 64)
    exact, sdpa = (t[0].transpose(0, 1).reshape(queries, -1) for t in (exact, sdpa))
    ours, theirs = (out.float() - exact).abs().max(), (sdpa.float() - exact).abs().max()
    assert ours <= 1.5 * theirs + 1e-3


def test_draft_attention_serves_bf16_heads_of_64_outside_autograd(fused):
    query, key = torch.randn(4, 6, 64).to(BF16), torch.randn(1, 3, 9, 64).to(BF16)
    assert not fused.attends(query.float(), key.float())
    assert not fused.attends(query[..., :32], key[..., :32])
    assert not fused.attends(query[:, :4], key)  # 4 query heads do not group over 3
    assert not fused.attends(query.requires_grad_(), key)


def test_a_killed_build_leaves_no_lock_that_later_builds_wait_on(tmp_path):
    """A build killed mid-way (a server's, by SIGTERM) left torch's `lock` file, and every later
    build waited on it for ever; the OS drops our lock with its process, and under it that file
    is gone."""
    import signal
    import subprocess
    import sys
    import time

    from dcoco.models.cpu.cpu_kernels import build_lock

    (tmp_path / "lock").touch()  # torch's baton, as a killed build leaves it
    code = (
        "import sys, time; from pathlib import Path; "
        "from dcoco.models.cpu.cpu_kernels import build_lock\n"
        "with build_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"held"
    assert not (tmp_path / "lock").exists()  # the holder cleared the dead build's baton
    (tmp_path / "lock").touch()  # the holder's own build, killed before it ends
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    with build_lock(tmp_path):  # not held any more: taken at once, the baton cleared
        assert not (tmp_path / "lock").exists()
    assert time.monotonic() - started < 5
