"""Drafter checkpoints: vLLM-readable config.json, exact round trip, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_target
from safetensors import safe_open
from safetensors.torch import save_file

from dcoco.errors import DcocoError
from dcoco.models.drafter.drafter import BlockDrafter
from dcoco.models.drafter.drafter_config import DrafterConfig
from dcoco.models.drafter.drafter_io import load_drafter, save_drafter


@pytest.fixture
def saved(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    config = DrafterConfig.for_target(
        target, block_size=5, mask_token_id=3, target_layer_ids=(0, 1, 3)
    )
    torch.manual_seed(0)
    drafter = BlockDrafter(config, target.embed_tokens, target.lm_head).eval()
    path = save_drafter(tmp_path / "drafter", drafter, target.info, dtype=torch.float32)
    return target, drafter, path


def draft_logits(drafter, target):
    ids = torch.arange(4, 24)[None]
    features = target.forward(ids, feature_layers=drafter.config.target_layer_ids).features
    logits, _ = drafter.draft(ids[:, -1], features[:, :-1], drafter.new_cache())
    return logits


def test_round_trip_gives_identical_logits(saved):
    target, drafter, path = saved
    loaded = load_drafter(path, target, dtype=torch.float32)
    assert loaded.config == drafter.config
    assert torch.equal(draft_logits(loaded, target), draft_logits(drafter, target))


def test_default_save_is_bf16_without_shared_weights(saved, tmp_path):
    target, drafter, _ = saved
    path = save_drafter(tmp_path / "bf16", drafter, target.info)
    with safe_open(path / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
        assert weights.get_tensor("fc.weight").dtype == torch.bfloat16
    assert not any("embed" in n or "lm_head" in n for n in names)


def test_config_json_has_the_fields_vllm_reads(saved):
    _, _, path = saved
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [0, 1, 3]}
    assert config["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert config["block_size"] == 5 and config["num_target_layers"] == 4
    assert config["num_hidden_layers"] == 2 and config["head_dim"] == 16
    assert config["tie_word_embeddings"] is False and config["attention_bias"] is False
    assert config["dcoco"]["target"]["vocab_size"] == 128
    assert config["dcoco"]["format_version"] == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_size": 96}, "vocab size is 128 for the drafter but 96"),
        ({"hidden_size": 32}, "hidden size is 64 for the drafter but 32"),
        ({"num_hidden_layers": 6}, "number of target layers is 4 for the drafter but 6"),
    ],
)
def test_loading_on_another_target_is_refused(saved, overrides, message):
    _, _, path = saved
    with pytest.raises(DcocoError, match=message):
        load_drafter(path, make_tiny_target("llama", **overrides))


def test_loading_on_a_same_shaped_but_different_target_is_refused(saved):
    _, _, path = saved
    with pytest.raises(DcocoError, match="different target"):
        load_drafter(path, make_tiny_target("llama", seed=1))


def test_truncated_weights_raise_a_clear_error(saved):
    target, _, path = saved
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(DcocoError, match="corrupt or truncated"):
        load_drafter(path, target)


def test_missing_dir_or_foreign_config_raise_clear_errors(saved, tmp_path):
    target, _, path = saved
    with pytest.raises(DcocoError, match="does not exist"):
        load_drafter(tmp_path / "nowhere", target)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DcocoError, match="not a DFlash drafter"):
        load_drafter(path, target)


def test_missing_weights_are_named(saved):
    target, drafter, path = saved
    weights = {k: v for k, v in drafter.state_dict().items() if k != "norm.weight"}
    save_file(weights, path / "model.safetensors")
    with pytest.raises(DcocoError, match="missing \\['norm.weight'\\]"):
        load_drafter(path, target)
