"""Where a drafting step's time goes in vLLM, per plugin stage (the corrector's cost by batch).

One vLLM engine in this process, bf16, the checkpoint CHECKPOINT of SmolLM2 at K drafts for every
batch size; a queue keeps BATCH requests of 48 tokens in flight (the schedule probe's queue,
dcoco.serving.vllm.engine_queue.queue_rate) on the held-out prompts PROMPTS (a JSONL of suite
records, as scripts/reproduce/schedule_prompts.py writes). The runner's, proposer's and plugin's
calls are wrapped with timers; prints milliseconds per engine step for each (indented: a part of
a timer above it).

CHECKPOINT is `plain` (no drafter: the same engine without speculation, K ignored), a shipped
checkpoint's name or a directory: the one `dcoco serve` hands vLLM (under $DCOCO_CACHE_DIR/serve/,
with its draft vocabulary) times what a server runs; a DRAFT_SCHEDULE ending in `@0` switches the
draft head off (dcoco.serving.head_ceiling); TEMPERATURE=1 samples (default 0);
DRAFT_SCHEDULE=GREEDY/SAMPLED@N/M serves that schedule instead of K at every batch size;
DRAFT_SAMPLING=probabilistic has sampled requests draw their drafts from the drafter's distribution
(vLLM's draft_sample_method; default greedy); SAMPLER=gumbel draws the recovered tokens and the
plugin's drafts with exponential noise as before 2026-12-06 (vLLM's own recovered tokens, not
dcoco.serving.vllm.recovered_tokens); LOCAL_ARGMAX=0 has vLLM take the argmax of the drafter's
logits itself (before `dcoco serve` set use_local_argmax_reduction).

Usage (the vLLM venv):
  LD_PRELOAD=.venv-vllm/lib/libiomp5.so VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    .venv-vllm/bin/python scripts/reproduce/vllm_draft_cost.py \
    CHECKPOINT K BATCH PROMPTS  # dcoco-joint-12k 2 16 runs/serve-logs/schedule-prompts.jsonl
"""

from __future__ import annotations

import collections
import os
import sys
import time

import torch

import dcoco.serving.vllm.draft_sampling as draft_sampling
import dcoco.serving.vllm.hints as hints
import dcoco.serving.vllm.model as model
import dcoco.serving.vllm.no_draft as no_draft
import dcoco.serving.vllm.recovered_tokens as recovered
from dcoco.models.heads.head_compile import HeadSelect
from dcoco.models.target.loading import resolve_target
from dcoco.paths import checkpoints_dir
from dcoco.serving.auto_schedule import probe_prompts
from dcoco.serving.draft_schedule import OPEN_END, parse_pair
from dcoco.serving.vllm.engine_queue import queue_rate
from dcoco.serving.vllm.settings import current, use

SECONDS: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()


def timed(name: str, function):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        SECONDS[name] += time.perf_counter() - start
        CALLS[name] += 1
        return result

    return wrapper


TARGET = "smollm2-135m-instruct"


def main(checkpoint: str, k: int, batch: int, prompts_file: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.sample import rejection_sampler, sampler
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    for name in ("add_copy_bonus", "point_mass_logits"):
        setattr(model, name, timed(name, getattr(model, name)))
    HeadSelect.__call__ = timed("head pick", HeadSelect.__call__)  # compiled or eager
    hints._write_batch = timed("copy hints", hints._write_batch)
    rejection_sampler.RejectionSampler.forward = timed(
        "rejection sampler", rejection_sampler.RejectionSampler.forward
    )
    sampler.Sampler.forward = timed("sampler", sampler.Sampler.forward)
    if os.environ.get("SAMPLER") == "gumbel":
        recovered._installed = True  # the plugin leaves vLLM's recovered tokens in place
        draft_sampling.sample = _gumbel
    speculative = None if checkpoint == "plain" else _speculative(checkpoint, k)
    llm = LLM(model=str(resolve_target(TARGET)), dtype="bfloat16",
              max_model_len=2048, enforce_eager=True, kv_cache_memory_bytes=1 << 30,
              max_num_seqs=32, speculative_config=speculative, seed=0)  # fmt: skip
    # after the plugin has installed its own wrappers
    GPUModelRunner.execute_model = timed("target forward", GPUModelRunner.execute_model)
    GPUModelRunner.sample_tokens = timed("sample + draft", GPUModelRunner.sample_tokens)
    if speculative is not None:
        DFlashProposer.propose = timed("drafter pass", DFlashProposer.propose)
        DFlashQwen3ForCausalLM.forward = timed("drafter layers", DFlashQwen3ForCausalLM.forward)
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        drafter = type(runner.drafter.model)
        drafter.compute_logits = timed("drafter logits + head", drafter.compute_logits)
        drafter.get_top_tokens = timed("drafter logits + head", drafter.get_top_tokens)
        _time_draft_parts(drafter, runner.drafter.model)
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        for text in probe_prompts(prompts_file)
    ]  # fmt: skip
    params = SamplingParams(temperature=float(os.environ.get("TEMPERATURE", "0")), max_tokens=48,
                            ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)  # fmt: skip

    def request(i: int):
        return {"prompt_token_ids": prompts[i % len(prompts)]}, params

    engine = llm.llm_engine
    queue_rate(engine, request, 2, 100)  # warm-up
    SECONDS.clear(), CALLS.clear()
    engine.step = timed("engine step", engine.step)
    rate, step = queue_rate(engine, request, batch, max(512, 2 * batch * 48))
    steps = CALLS["engine step"]
    print(
        f"{checkpoint}, K = {k}, {batch} requests: {rate:.1f} tokens/s, {step * 1e3:.1f} ms a step"
    )
    for name, seconds in SECONDS.most_common():
        print(f"  {name:24s} {seconds / steps * 1e3:7.2f} ms a step")
    shortcuts = ", ".join(f"{name} {count}" for name, count in no_draft.STEPS.items())
    print("  steps without drafts:", shortcuts)


def _time_draft_parts(drafter, instance) -> None:
    """Timers inside the drafter pass: the proposer's input preparation, the sampled drafts'
    logits (the drafter's LM head over its columns) and their draw."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    for name in ("set_inputs_first_pass", "build_model_inputs_first_pass"):
        setattr(DFlashProposer, name, timed(f"  proposer {name}", getattr(DFlashProposer, name)))
    drafter.combine_hidden_states = timed("  combine hidden states", drafter.combine_hidden_states)
    drafter.sample_drafts = timed("  sampled drafts", drafter.sample_drafts)
    instance.logits_processor.forward = timed(
        "    drafter LM head", instance.logits_processor.forward
    )
    model.draw = timed("    draft draw", model.draw)


def _gumbel(probs):
    """A draw per row by argmax of p / Exp(1) noise, as the plugin drew its drafts before."""
    return (probs / torch.empty_like(probs).exponential_()).argmax(-1)


def _speculative(checkpoint: str, k: int) -> dict:
    return {
        "method": "dflash",
        "model": checkpoint if "/" in checkpoint else str(checkpoints_dir() / TARGET / checkpoint),
        "num_speculative_tokens": 7,
        "num_speculative_tokens_per_batch_size": _schedule(k),
        "disable_eagle_block_drop": True,
        # as `dcoco serve` sets it (the drafter hands over token ids); LOCAL_ARGMAX=0: vLLM's
        # argmax over the logits compute_logits spreads over every token, as before
        "use_local_argmax_reduction": os.environ.get("LOCAL_ARGMAX", "1") == "1",
        "draft_sample_method": os.environ.get("DRAFT_SAMPLING", "greedy"),
    }


def _schedule(k: int) -> list:
    """K at every batch size, or the served schedule DRAFT_SCHEDULE (`GREEDY/SAMPLED@N/M`, as
    `dcoco serve` logs it), its sampled part and ceilings put in this process's plugin settings."""
    text = os.environ.get("DRAFT_SCHEDULE", "")
    if not text:
        return [[1, OPEN_END, k]]
    use(current().with_schedule(text))
    return [list(entry) for entry in parse_pair(text, max_k=7)[0]]


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
