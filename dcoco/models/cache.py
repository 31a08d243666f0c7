"""KV-cache bookkeeping in one place: length and rollback by cropping, never by copying."""

from __future__ import annotations

from transformers import DynamicCache


def new_cache(config) -> DynamicCache:
    return DynamicCache(config=config)


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
