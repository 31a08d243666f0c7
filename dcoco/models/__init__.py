"""Models: the target adapter, its KV cache helpers and the drafters."""
