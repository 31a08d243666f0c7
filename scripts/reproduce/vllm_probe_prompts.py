"""What the schedule probe's prompts decide: drafting's speed at one request depends on them.

One vLLM engine in this process per (K, prefix caching), bf16, the shipped dcoco drafter, every
batch size at K. Each cell is the probe's own queue (dcoco.serving.vllm.engine_queue.queue_rate,
timed from the first completion), on the probe's built-in prompts (48 tokens, EOS ignored, as the
probe runs; and 128 tokens to EOS) and on the bench's suite prompts (gsm8k, humaneval, mtbench, 2
each; 128 tokens to EOS), at 1 and 4 requests in flight. Prints tokens/s and τ of each cell.

Usage (the vLLM venv; reads ../shared/data or DCOCO_DATA_DIR):
  LD_PRELOAD=.venv-vllm/lib/libiomp5.so VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    .venv-vllm/bin/python scripts/reproduce/vllm_probe_prompts.py
"""

from __future__ import annotations

import gc

from dcoco.eval.suites import load_prompts
from dcoco.models.target.loading import resolve_target
from dcoco.paths import checkpoints_dir, data_dir
from dcoco.serving.probe_prompts import PROMPTS
from dcoco.serving.vllm.engine_queue import queue_rate, spec_counts

TARGET, CHECKPOINT = "smollm2-135m-instruct", "dcoco-joint-12k"
CELLS = (  # (name, prompts, max tokens, ignore EOS, requests in flight)
    ("probe, 48 tokens", "probe", 48, True, 1),
    ("probe, 128 tokens", "probe", 128, False, 1),
    ("suites, 128 tokens", "suites", 128, False, 1),
    ("probe, 128 tokens", "probe", 128, False, 4),
    ("suites, 128 tokens", "suites", 128, False, 4),
)


def _engine(k: int, prefix_caching: bool):
    from vllm import LLM

    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
        "num_speculative_tokens": 7,
        "num_speculative_tokens_per_batch_size": [[1, 1 << 16, k]],
        "disable_eagle_block_drop": True,
    }
    return LLM(model=str(resolve_target(TARGET)), dtype="bfloat16", max_model_len=2048,
               enforce_eager=True, kv_cache_memory_bytes=1 << 30, max_num_seqs=32, seed=0,
               speculative_config=speculative, disable_log_stats=False,
               enable_prefix_caching=prefix_caching)  # fmt: skip


def _cell(llm, prompts: list, max_tokens: int, ignore_eos: bool, batch: int) -> tuple[float, float]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos,
                            output_kind=RequestOutputKind.DELTA)  # fmt: skip
    drafts, accepted = spec_counts(llm)
    rate, _ = queue_rate(llm.llm_engine, lambda i: ({"prompt_token_ids": prompts[i % len(prompts)]},
                      params), batch, max(256, 2 * batch * max_tokens))  # fmt: skip
    drafts_after, accepted_after = spec_counts(llm)
    drafts = drafts_after - drafts
    return rate, 1 + (sum(accepted_after) - sum(accepted)) / drafts if drafts else 1.0


def main() -> None:
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    suites = [p.turns[0] for p in load_prompts(str(data_dir()), "", "gsm8k,humaneval,mtbench", 2)]
    for k in (7, 0):
        for prefix_caching in (True, False):
            llm = _engine(k, prefix_caching)
            tokenizer = llm.get_tokenizer()
            encoded = {
                name: [
                    tokenizer.apply_chat_template(
                        [{"role": "user", "content": t}],
                        add_generation_prompt=True,
                        tokenize=True,
                        return_dict=False,
                    )
                    for t in texts
                ]  # fmt: skip
                for name, texts in (("probe", PROMPTS), ("suites", suites))
            }
            _cell(llm, encoded["probe"], 48, True, 2)  # warm-up
            for name, prompts, max_tokens, ignore_eos, batch in CELLS:
                rate, tau = _cell(llm, encoded[prompts], max_tokens, ignore_eos, batch)
                print(f"K={k} prefix caching={prefix_caching} {name}, {batch} in flight: "
                      f"{rate:.1f} tokens/s, tau {tau:.2f}", flush=True)  # fmt: skip
            del llm
            gc.collect()
            cleanup_dist_env_and_memory()


if __name__ == "__main__":
    main()
