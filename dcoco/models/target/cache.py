"""KV-cache bookkeeping in one place: length and rollback by cropping, never by copying.

transformers' DynamicLayer appends by `torch.cat`, which copies a layer's whole K/V on every
forward: a decoding step pays O(context) bytes per layer besides its weights. GrowingLayer keeps
the K/V in a buffer with spare room (doubled when full) and writes the new positions in place, so
a step copies only its own tokens; cropping a rejected draft just narrows the view. The attention
reads the same values either way (bit-equal logits, see tests/test_cache.py). Measured with
`scripts/reproduce/kv_cache_cost.py`.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 256  # positions a fresh buffer holds at least: a prompt plus a few cycles


class GrowingLayer(DynamicLayer):
    """A full-attention layer's K/V [batch, kv_heads, positions, head_dim] as views of a buffer
    with room for more positions, kept in `storage_dtype` where one is given (the new positions
    cast on the way in; None: the K/V's own dtype). Inference only: a key that needs grad takes
    the parent's path (an in-place write into a buffer would clobber what autograd saved)."""

    def __init__(self, storage_dtype: torch.dtype | None = None):
        super().__init__()
        self.storage_dtype = storage_dtype

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_room: Tensor | None = None  # [batch, kv_heads, capacity, head_dim]
        self.value_room: Tensor | None = None

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.requires_grad or value_states.requires_grad:
            self.key_room = self.value_room = None
            return super().update(key_states, value_states, *args, **kwargs)
        old = self.get_seq_length()
        new = old + key_states.shape[-2]
        if not self._room_for(key_states, old, new):
            self._regrow(key_states, value_states, old, new)
        self.key_room[..., old:new, :] = key_states
        self.value_room[..., old:new, :] = value_states
        self.keys = self.key_room[..., :new, :]
        self.values = self.value_room[..., :new, :]
        return self.keys, self.values

    def _room_for(self, key_states: Tensor, old: int, new: int) -> bool:
        """Whether the buffer can take positions old..new-1 and the cached K/V still live in it
        (a batch reorder or a parent-path update replaces them with tensors of their own)."""
        room = self.key_room
        if room is None or new > room.shape[-2] or room.dtype != self._dtype(key_states):
            return False
        if room.shape[:2] != key_states.shape[:2] or room.shape[-1] != key_states.shape[-1]:
            return False
        return old == 0 or self.keys.data_ptr() == room.data_ptr()

    def _regrow(self, key_states: Tensor, value_states: Tensor, old: int, new: int) -> None:
        """New buffers with room for 2x `new` positions, holding the first `old` cached ones."""
        capacity = max(MIN_ROOM, 2 * new)
        dtype = self._dtype(key_states)
        key_room = key_states.new_empty(
            (*key_states.shape[:2], capacity, key_states.shape[-1]), dtype=dtype
        )
        value_room = value_states.new_empty(
            (*value_states.shape[:2], capacity, value_states.shape[-1]), dtype=dtype
        )
        if old:
            key_room[..., :old, :] = self.keys[..., :old, :]
            value_room[..., :old, :] = self.values[..., :old, :]
        self.key_room, self.value_room = key_room, value_room

    def _dtype(self, key_states: Tensor) -> torch.dtype:
        return self.storage_dtype or key_states.dtype


def new_cache(config=None, storage_dtype: torch.dtype | None = None) -> DynamicCache:
    """An empty cache: GrowingLayer for every full-attention layer of `config` (the other kinds
    keep transformers' own layer); without a config, GrowingLayers made as layers are reached.
    `storage_dtype`: what the GrowingLayers keep their K/V in (None: the K/V's own dtype)."""
    cache = DynamicCache(config=config)
    if config is None:
        cache.layer_class_to_replicate = functools.partial(GrowingLayer, storage_dtype)
        return cache
    cache.layers = [
        GrowingLayer(storage_dtype) if type(layer) is DynamicLayer else layer
        for layer in cache.layers
    ]
    return cache


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Forget every position at or after `length` (a rejected draft's K/V)."""
    current = cache.get_seq_length()
    if length > current or length < 0:
        raise ValueError(f"cannot crop a cache of length {current} to {length}")
    if length < current:
        # transformers 5.x: a negative argument removes that many trailing positions.
        cache.crop(length - current)
