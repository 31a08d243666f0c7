"""oneDNN prepacked linear layers (dcoco.models.target.packed_linear): same outputs, the same
decoding."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target
from torch import nn

from dcoco.decode.dflash_proposer import DFlashProposer
from dcoco.decode.engine import Engine
from dcoco.decode.proposers import PromptLookupProposer
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.target.packed_linear import (
    PackedLinear,
    amx_bf16,
    onednn_available,
    pack_linears,
    resolve_matmul,
)
from dcoco.models.target.target import TargetModel

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not onednn_available(torch.float32), reason="torch built without oneDNN"),
]
CPU = torch.device("cpu")


def packed_target(dtype: torch.dtype = torch.float32) -> TargetModel:
    model = make_tiny_target("llama").model.to(dtype)
    pack_linears(model)
    return TargetModel(model, name="tiny-packed", matmul="onednn")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 8, 16])
def test_packed_linear_equals_f_linear(dtype, rows):
    if not onednn_available(dtype):
        pytest.skip("no oneDNN bf16 on this CPU")
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=True).to(dtype)
    x = torch.randn(2, rows, 96).to(dtype)  # [batch, rows, in]: any leading shape
    expected = linear(x).float()
    got = PackedLinear(linear)(x)
    assert got.shape == (2, rows, 200) and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), expected, atol=tolerance, rtol=tolerance)


def test_every_linear_and_the_tied_head_are_packed():
    target = packed_target()
    assert [m for m in target.model.modules() if isinstance(m, nn.Linear)] == []
    assert isinstance(target.lm_head, PackedLinear)
    assert target.embed_tokens.weight.dtype == torch.float32  # the lookup keeps its rows


def test_packed_logits_match_aten_logits():
    aten, packed = make_tiny_target("llama"), packed_target()
    ids = torch.randint(5, 128, (1, 24), generator=torch.Generator().manual_seed(3))
    expected = aten.forward(ids, aten.new_cache()).logits
    got = packed.forward(ids, packed.new_cache()).logits
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_fp32_speculative_output_equals_plain_with_packed_linears():
    """The exactness guarantee holds with the packed kernel: greedy output of prompt lookup and
    the block drafter (packed too, as decoding packs it) equals plain decoding through the same
    packed target."""
    target = packed_target()
    config = DrafterConfig.for_target(target, num_layers=1, block_size=5, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    torch.manual_seed(0)
    drafter = pack_linears(BlockDrafter(config, target.embed_tokens, target.lm_head))
    assert [m for m in drafter.modules() if isinstance(m, nn.Linear)] == []
    for seed in range(3):
        prompt = torch.randint(5, 128, (10,), generator=torch.Generator().manual_seed(seed))
        plain = Engine(target).generate(prompt.tolist(), 40)
        for proposer in (PromptLookupProposer(6), DFlashProposer(drafter)):
            assert Engine(target, proposer).generate(prompt.tolist(), 40).new_ids == plain.new_ids


def test_matmul_resolution():
    assert resolve_matmul("auto", "fp32", torch.float32, CPU) == "onednn"
    assert resolve_matmul("auto", "int8", torch.bfloat16, CPU) == "aten"  # int8 has its own
    assert resolve_matmul("auto", "fp16", torch.float16, CPU) == "aten"
    assert resolve_matmul("auto", "bf16", torch.bfloat16, torch.device("cuda")) == "aten"
    assert resolve_matmul("aten", "fp32", torch.float32, CPU) == "aten"
    with pytest.raises(DcocoError, match="matmul onednn needs a CPU target"):
        resolve_matmul("onednn", "int8", torch.bfloat16, CPU)
    with pytest.raises(DcocoError, match="unknown matmul 'mkl'"):
        resolve_matmul("mkl", "fp32", torch.float32, CPU)


def test_amx_bf16_reads_the_cpus_flags(tmp_path):
    """AMX is named by the kernel's flags: present on a Sapphire Rapids Xeon, absent on an EPYC
    with AVX-512 bf16, and False where there is no cpuinfo to read."""
    for name, flags, expected in (
        ("xeon", "fpu avx512_bf16 amx_bf16 amx_tile", True),
        ("epyc", "fpu avx512f avx512_bf16", False),
    ):
        cpuinfo = tmp_path / name
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        assert amx_bf16(str(cpuinfo)) is expected
    assert amx_bf16(str(tmp_path / "missing")) is False
