"""Serving through vLLM: the plugin, the draft model, and the patches it applies."""
