"""Peer engines as bench rows: the same prompts and token budget, decoded by other people's code.

- `hf`: transformers' own `generate` on the target (the bench's precision, SDPA, aten linears);
- `hf-pld`: the same with its prompt lookup decoding (`prompt_lookup_num_tokens`);
- `llama-cpp`: llama.cpp (llama-cpp-python, `make llama-cpp`) on the target's GGUF as shipped.

Each takes the prompt's token ids (our chat template), stops on the target's stop ids and returns
a GenerationResult whose stats carry tokens and wall time only (a peer reports no cycles).
"""

from __future__ import annotations

import time

import torch

from dcoco.contracts import SamplingParams
from dcoco.decode.engine import GenerationResult
from dcoco.decode.stats import RequestStats
from dcoco.errors import DcocoError
from dcoco.models.target.target import TargetModel

PEER_METHODS = ("hf", "hf-pld", "llama-cpp")
HF_PLD_TOKENS = 10  # transformers' documented example value for prompt_lookup_num_tokens


class HFPeer:
    """transformers `generate`, plain or with prompt lookup, on its own copy of the target."""

    def __init__(self, model_dir, target: TargetModel, dtype: torch.dtype, prompt_lookup: bool):
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype, attn_implementation="sdpa"
        ).eval()
        self.model.generation_config = GenerationConfig()  # no defaults from the checkpoint
        self.stop_ids = sorted(target.stop_ids)
        self.prompt_lookup = prompt_lookup
        self.precision = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))

    @torch.inference_mode()
    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling=None, seed: int = 0
    ) -> GenerationResult:
        sampling = sampling or SamplingParams()
        options = dict(
            max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids,
            pad_token_id=self.stop_ids[0], do_sample=sampling.temperature > 0,
        )  # fmt: skip
        if sampling.temperature > 0:
            options |= dict(temperature=sampling.temperature, top_p=sampling.top_p,
                            top_k=sampling.top_k)  # fmt: skip
        if self.prompt_lookup:
            options["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
        torch.manual_seed(seed)
        start = time.perf_counter()
        out = self.model.generate(torch.tensor([prompt_ids]), **options)
        elapsed = time.perf_counter() - start
        return _result(prompt_ids, out[0, len(prompt_ids) :].tolist(), self.stop_ids, elapsed)


class LlamaCppPeer:
    """llama.cpp through llama-cpp-python on the GGUF file itself (its own kernels and format)."""

    precision = "gguf (llama.cpp)"

    def __init__(self, gguf_path, target: TargetModel, threads: int):
        try:
            from llama_cpp import Llama
        except ImportError as error:
            raise DcocoError(
                "method llama-cpp needs llama-cpp-python: run `make llama-cpp` (it compiles "
                "llama.cpp, several minutes)"
            ) from error
        self.llm = Llama(
            model_path=str(gguf_path),
            n_ctx=target.max_context,
            n_threads=threads,
            n_threads_batch=threads,  # the prompt too: its default is every core of the machine
            verbose=False,
        )
        self.stop_ids = sorted(target.stop_ids)

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling=None, seed: int = 0
    ) -> GenerationResult:
        sampling = sampling or SamplingParams()
        greedy = sampling.temperature <= 0
        self.llm.set_seed(seed)
        new_ids: list[int] = []
        start = time.perf_counter()
        tokens = self.llm.generate(
            prompt_ids, reset=True, temp=sampling.temperature, repeat_penalty=1.0, min_p=0.0,
            top_k=1 if greedy else sampling.top_k, top_p=1.0 if greedy else sampling.top_p,
        )  # fmt: skip
        for token in tokens:
            new_ids.append(int(token))
            if token in self.stop_ids or len(new_ids) >= max_new_tokens:
                break
        elapsed = time.perf_counter() - start
        return _result(prompt_ids, new_ids, self.stop_ids, elapsed)


def _result(prompt_ids: list[int], new_ids: list[int], stop_ids, elapsed: float):
    stop = bool(new_ids) and new_ids[-1] in stop_ids
    stats = RequestStats(prompt_tokens=len(prompt_ids), new_tokens=len(new_ids), total_s=elapsed)
    return GenerationResult(list(prompt_ids), new_ids, "stop" if stop else "length", stats)
