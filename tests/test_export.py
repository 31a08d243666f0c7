"""`dcoco export` (dcoco.serving.export): a drafter with a head and a copy gate becomes a plain
DFlash checkpoint; what stock vLLM cannot run is dropped and recorded. The vLLM side (stock
vLLM loads it, same weights, same output as plain decoding) is tests/test_vllm_export.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import load_drafter
from dcoco.models.heads.head_io import save_with_head
from dcoco.models.heads.head_registry import build_head
from dcoco.serving.export import ExportConfig, export


@pytest.fixture
def headed(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    config = DrafterConfig.for_target(
        target, block_size=4, mask_token_id=3, target_layer_ids=(0, 1)
    )
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).eval()
    drafter.add_copy_gate()
    fields = {"hidden_size": config.hidden_size, "top_k": 4, "mlp_hidden": 8}
    head = build_head("dcoco", fields, target.embed_tokens)
    return save_with_head(tmp_path / "headed", drafter, head, target.info, dtype=torch.float32)


def test_export_keeps_the_drafter_and_drops_what_stock_vllm_cannot_run(
    tiny_llama_target, headed, tmp_path
):
    out, dropped = export(ExportConfig(drafter=str(headed), out=str(tmp_path / "x"), dtype="fp32"))
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["DFlashDraftModel"] and "dcoco_head" not in hf
    assert hf["dcoco"]["copy_hints"] is False and hf["dcoco"]["copy_gate"] is False
    assert (
        dropped[:2] == ["copy_gate", "head"] and hf["dcoco"]["exported_from"]["dropped"] == dropped
    )
    source, exported = (
        load_file(str(headed / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    assert set(exported) == {k for k in source if not k.startswith(("head.", "copy_gate."))}
    assert all(torch.equal(exported[k], source[k]) for k in exported)
    drafter = load_drafter(out, tiny_llama_target)  # our loader reads it back: a plain drafter
    assert drafter.copy_gate is None and drafter.config.block_size == 4


def test_bad_export_requests_are_one_clear_error(headed, tmp_path):
    with pytest.raises(DcocoError, match="--dtype"):
        export(ExportConfig(drafter=str(headed), out=str(tmp_path / "x"), dtype="int3"))
    with pytest.raises(DcocoError, match="no drafter checkpoint"):
        export(ExportConfig(drafter=str(tmp_path / "nowhere"), out=str(tmp_path / "y")))
