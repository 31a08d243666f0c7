"""The growing KV cache (dcoco.models.target.cache): the same logits as transformers' DynamicCache,
with
appends written in place instead of copying the whole cache."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_target
from transformers import DynamicCache

import dcoco.models.target.cache as cache_module
from dcoco.models.target.cache import GrowingLayer, crop_cache, new_cache

pytestmark = pytest.mark.usefixtures("one_thread")


def decode_script(target, cache, ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits of a prefill, then verify blocks of varying size with crops between them, the way
    the engine drives a cache."""
    prefill = 20
    outs = [target.forward(ids[:, :prefill], cache, last_logits_only=True).logits]
    position = prefill
    for block, accepted in [(1, 1), (8, 3), (5, 5), (8, 0), (16, 9), (3, 1), (1, 1)] * 2:
        outs.append(target.forward(ids[:, position : position + block], cache).logits)
        position += accepted
        crop_cache(cache, position)
    return outs


@pytest.mark.parametrize("arch,dtype", [("llama", torch.float32), ("qwen3", torch.bfloat16)])
def test_growing_cache_gives_the_logits_of_dynamic_cache_bit_for_bit(arch, dtype, monkeypatch):
    monkeypatch.setattr(cache_module, "MIN_ROOM", 8)  # the prefill's buffer fills up mid-run
    target = make_tiny_target(arch)
    target.model.to(dtype)
    ids = torch.randint(5, 128, (1, 100), generator=torch.Generator().manual_seed(1))
    ours = new_cache(target.config)
    theirs = DynamicCache(config=target.config)
    assert all(isinstance(layer, GrowingLayer) for layer in ours.layers)
    for a, b in zip(
        decode_script(target, ours, ids), decode_script(target, theirs, ids), strict=True
    ):
        assert torch.equal(a, b)
    assert ours.get_seq_length() == theirs.get_seq_length()
    room = ours.layers[0].key_room
    assert room.shape[-2] > 2 * 20  # it regrew once it passed the prefill's room
    assert ours.layers[0].keys.data_ptr() == room.data_ptr()  # and appends went into the buffer


def test_appends_after_a_crop_overwrite_the_rejected_positions():
    layer = GrowingLayer()
    first = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(1, 2, 6, 4)
    layer.update(first, -first)
    layer.crop(-4)  # keep 2 positions
    new = torch.full((1, 2, 3, 4), 7.0)
    keys, values = layer.update(new, -new)
    assert keys.shape[-2] == 5 and layer.get_seq_length() == 5
    assert torch.equal(keys[..., :2, :], first[..., :2, :])
    assert torch.equal(keys[..., 2:, :], new) and torch.equal(values[..., 2:, :], -new)


def test_a_batch_reorder_moves_the_cache_out_of_the_buffer_and_the_next_append_regrows():
    layer = GrowingLayer()
    states = torch.randn(3, 2, 5, 4)
    layer.update(states, states)
    layer.batch_select_indices(torch.tensor([2, 0]))  # transformers' own: new tensors
    step = torch.randn(2, 2, 1, 4)
    keys, _ = layer.update(step, step)
    assert torch.equal(keys, torch.cat([states[[2, 0]], step], dim=2))
    assert keys.data_ptr() == layer.key_room.data_ptr()


def test_keys_that_need_grad_take_the_copying_path():
    layer = GrowingLayer()
    states = torch.randn(1, 2, 3, 4, requires_grad=True)
    keys, _ = layer.update(states, states)
    keys.sum().backward()
    assert layer.key_room is None and torch.equal(states.grad, torch.ones_like(states))


def test_a_config_less_cache_grows_its_layers_as_they_are_reached():
    cache = new_cache()
    states = torch.randn(1, 2, 3, 4)
    cache.update(states, states, layer_idx=0)
    cache.update(states, states, layer_idx=1)
    assert [type(layer) for layer in cache.layers] == [GrowingLayer, GrowingLayer]
    crop_cache(cache, 1)
    assert cache.get_seq_length() == 1
