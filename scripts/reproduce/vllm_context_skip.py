"""What skipping the drafter's context at K = 0 costs in acceptance (dcoco.serving.vllm.no_draft).

One vLLM engine in this process, bf16, the shipped dcoco drafter, schedule `1-3:7,4-:0`. A warm-up
batch fills the KV cache with other requests' context (so skipped positions hold stale K/V, as in
a long-running server). Then 16 requests start together: 14 stop after 48 tokens, during which
the batch is above the drafting range and the step drafts nothing; two run on alone to 256 tokens
and draft. Their τ is printed with the context stored at every K = 0 step and with it skipped
beyond the largest drafting batch (margin 0), on the same prompts.

Usage (the vLLM venv; reads ../shared/data or DCOCO_DATA_DIR):
  VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python scripts/reproduce/vllm_context_skip.py
"""

from __future__ import annotations

from dcoco.eval.suites import load_prompts
from dcoco.models.target.loading import resolve_target
from dcoco.paths import checkpoints_dir, data_dir

TARGET, CHECKPOINT = "smollm2-135m-instruct", "dcoco-joint-12k"
SCHEDULE = [[1, 3, 7], [4, 1 << 16, 0]]
LONG, SHORT, REQUESTS = 256, 48, 16


def _forget_limit(worker) -> None:
    worker.model_runner.__dict__.pop("dcoco_context_limit", None)  # read again at the next step


def _tau(llm, prompts, params) -> float:
    def counts() -> dict:
        return {m.name: getattr(m, "value", 0) or 0 for m in llm.get_metrics()}

    before = counts()
    llm.chat(prompts, params, use_tqdm=False)
    after = counts()
    drafts = after["vllm:spec_decode_num_drafts"] - before["vllm:spec_decode_num_drafts"]
    accepted = (
        after["vllm:spec_decode_num_accepted_tokens"]
        - before["vllm:spec_decode_num_accepted_tokens"]
    )
    return 1 + accepted / drafts


def main() -> None:
    from vllm import LLM, SamplingParams

    from dcoco.serving.vllm import no_draft as vllm_no_draft

    texts = [p.turns[0] for p in load_prompts(str(data_dir()), "", "gsm8k,humaneval,mtbench", 12)]
    chats = [[{"role": "user", "content": t}] for t in texts]
    warm, test = chats[-REQUESTS:], chats[:REQUESTS]
    params = [SamplingParams(temperature=0, max_tokens=LONG if i in (1, 2) else SHORT)
              for i in range(REQUESTS)]  # fmt: skip
    speculative = {
        "method": "dflash",
        "model": str(checkpoints_dir() / TARGET / CHECKPOINT),
        "num_speculative_tokens": 7,
        "num_speculative_tokens_per_batch_size": SCHEDULE,
        "disable_eagle_block_drop": True,
    }
    llm = LLM(model=str(resolve_target(TARGET)), dtype="bfloat16", max_model_len=2048,
              enforce_eager=True, kv_cache_memory_bytes=160 << 20, max_num_seqs=REQUESTS,
              speculative_config=speculative, seed=0, disable_log_stats=False)  # fmt: skip
    for margin in (1 << 16, 0):
        vllm_no_draft.CONTEXT_MARGIN = 1 << 16  # the warm-up leaves real context behind
        llm.collective_rpc(_forget_limit)
        llm.chat(warm, SamplingParams(temperature=0, max_tokens=LONG), use_tqdm=False)
        vllm_no_draft.CONTEXT_MARGIN = margin
        llm.collective_rpc(_forget_limit)
        skipped = vllm_no_draft.STEPS["context_skipped"]
        tau = _tau(llm, test, params)
        skipped = vllm_no_draft.STEPS["context_skipped"] - skipped
        print(f"margin {margin}: tau of the long requests {tau:.3f}, K = 0 steps skipped {skipped}")


if __name__ == "__main__":
    main()
