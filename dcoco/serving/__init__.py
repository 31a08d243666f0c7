"""Serving through vLLM: the plugin that runs dcoco's draft heads inside vLLM's DFlash drafter
(`vllm_plugin`, `vllm_model`), the `dcoco serve` launcher and the `dcoco bench-serve` client.

Nothing here imports vLLM at module level except `vllm_model`, which vLLM itself imports.
"""
