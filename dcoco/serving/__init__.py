"""Serving through vLLM: the plugin that runs dcoco's draft heads inside vLLM's DFlash drafter
(`vllm_plugin`, `vllm_model`) and the `dcoco serve` launcher. The `dcoco bench-serve` load client
is an evaluation tool and lives in dcoco.eval.served.bench.

Nothing here imports vLLM at module level except `vllm_model`, which vLLM itself imports.
"""
