"""The LM head's precision (dcoco.models.target.head_precision, `--head-dtype`): an fp32 head
beside a half-precision target computes each verify row as the step computes it, output stays
plain's, a drafter in fp32 shares it, and `auto` weighs it only where it may pay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_target

import dcoco.decode.auto_precision as auto_precision
import dcoco.decode.cost_curve as cost_curve
import dcoco.models.target.head_precision as head_precision
from dcoco.decode.engine import Engine
from dcoco.decode.methods import MethodOptions, build_proposer
from dcoco.decode.session import DecodeConfig
from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import save_drafter
from dcoco.models.target.head_precision import Fp32Head, install_head
from dcoco.models.target.precision import quantise_int8_weights
from dcoco.models.target.target import TargetModel

pytestmark = pytest.mark.usefixtures("one_thread")


def bf16_target(head_dtype: str = "fp32") -> TargetModel:
    model = make_tiny_target("llama").model.to(torch.bfloat16)
    install_head(model, head_dtype)
    return TargetModel(model, name="tiny-llama", precision="bf16")


def test_the_fp32_head_computes_each_row_as_alone_and_in_fp32():
    weight = bf16_target("target").lm_head.weight.float()  # the bf16 head's values
    target = bf16_target()
    assert isinstance(target.lm_head, Fp32Head) and target.head_dtype == "fp32"
    rows = torch.randn(9, weight.shape[1]).to(torch.bfloat16)  # a step's row, then a verify's
    together = target.lm_head(rows)
    assert together.dtype == torch.float32
    alone = torch.cat([target.lm_head(rows[i : i + 1]) for i in range(9)])
    assert torch.equal(together, alone)
    assert torch.allclose(together, F.linear(rows.float(), weight), atol=1e-4)


def test_greedy_speculative_output_with_the_fp32_head_is_plain_decodings():
    target = bf16_target()
    proposer = build_proposer("pld", target, MethodOptions())
    for seed in range(3):
        prompt = torch.randint(5, 128, (12,), generator=torch.Generator().manual_seed(seed))
        plain = Engine(target).generate(prompt.tolist(), 32).new_ids
        assert Engine(target, proposer).generate(prompt.tolist(), 32).new_ids == plain


def test_an_fp32_drafter_shares_the_targets_fp32_head(tmp_path):
    target = bf16_target()
    config = DrafterConfig.for_target(target, block_size=5, mask_token_id=3,
                                      target_layer_ids=(0, 1, 3))  # fmt: skip
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head)
    path = save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)
    proposer = build_proposer(f"dflash@{path}", target, MethodOptions(draft_dtype="fp32"))
    assert proposer.drafter.dtype == torch.float32
    assert proposer.drafter._shared[1] is target.lm_head  # one fp32 copy, not two


def test_the_target_head_stays_and_bad_settings_fail_in_one_line():
    assert bf16_target("target").head_dtype == "target"
    with pytest.raises(DcocoError, match="unknown head dtype 'fp8'"):
        head_precision.check_head_dtype("fp8")
    model = make_tiny_target("llama").model.to(torch.bfloat16)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untied
    quantise_int8_weights(model)
    with pytest.raises(DcocoError, match="--head-dtype target"):
        install_head(model, "fp32")
    full = make_tiny_target("llama").model
    install_head(full, "fp32")  # an fp32 target's head is fp32 already: left as it is
    assert type(full.get_output_embeddings()) is torch.nn.Linear


def test_auto_weighs_the_fp32_head_only_for_half_precision_on_an_emulating_cpu(monkeypatch):
    monkeypatch.setattr(head_precision, "native_bf16", lambda: False)
    monkeypatch.setattr(auto_precision, "has_gguf", lambda spec: True)
    monkeypatch.setattr(auto_precision, "int4_dot_available", lambda: False)  # no gguf-a8
    settings = auto_precision._settings(DecodeConfig())
    assert settings == {
        "bf16": ("bf16", "target"),
        "bf16 fp32-head": ("bf16", "fp32"),
        "gguf": ("gguf", "target"),
        "gguf fp32-head": ("gguf", "fp32"),
        "fp32": ("fp32", "target"),
    }
    assert list(auto_precision._settings(DecodeConfig(dtype="gguf", head_dtype="target"))) == [
        "gguf"
    ]
    monkeypatch.setattr(head_precision, "native_bf16", lambda: True)
    assert list(auto_precision._settings(DecodeConfig())) == ["bf16", "gguf", "fp32"]
    monkeypatch.setattr(auto_precision, "int4_dot_available", lambda: True)  # AVX-512 VNNI or AVX2
    assert list(auto_precision._settings(DecodeConfig())) == ["bf16", "gguf", "gguf-a8", "fp32"]
    # nothing left to weigh: no measurement, the target's head
    cpu = DecodeConfig(dtype="gguf", device="cpu")
    assert auto_precision.resolve_precision(cpu, ["dflash"]) == ("gguf", "target")
    with pytest.raises(DcocoError, match="unknown head dtype"):
        auto_precision.resolve_precision(DecodeConfig(head_dtype="bf17"), [])


def test_cached_curves_timed_apart_are_timed_again_together(tmp_path, monkeypatch):
    monkeypatch.setenv("DCOCO_CACHE_DIR", str(tmp_path))
    targets = [make_tiny_target("llama"), bf16_target()]
    first = cost_curve.forward_curve(targets[0])  # timed alone
    calls = []
    measure = cost_curve.measure_forwards
    monkeypatch.setattr(cost_curve, "measure_forwards",
                        lambda ts, *a: calls.append(len(ts)) or measure(ts, *a))  # fmt: skip
    together = cost_curve.forward_curves(targets)
    assert calls == [2]  # the second was missing: both timed again, in one run
    assert together[0].batch == together[1].batch != first.batch
    assert cost_curve.forward_curves(targets) == together and calls == [2]  # now read back
    for path in (tmp_path / "profiles").iterdir():  # as cached before curves had a batch
        path.write_text(path.read_text().replace(together[0].batch, ""))
    assert cost_curve.forward_curve(targets[0]).batch == ""  # alone, it is read back
    cost_curve.forward_curves(targets)
    assert calls == [2, 2]  # together, they are timed again
