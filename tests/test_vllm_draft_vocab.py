"""A draft vocabulary inside vLLM (`dcoco serve --draft-vocab`, dcoco.serving.checkpoint_view):
the drafter's head is the target's rows of the vocabulary, in vLLM's own `draft_vocab_size` +
`d2t` layout, for a stock DFlash drafter and for ours with the DCOCO corrector (which then scores
over the vocabulary's columns); every draft is a vocabulary token and greedy fp32 output stays
plain vLLM's.

Run in the vLLM venv (`make test-vllm`). The engines run in this process one after another
(VLLM_ENABLE_V1_MULTIPROCESSING=0), eager, fp32, one OpenMP thread, all prompts in one batch.
"""

from __future__ import annotations

import gc

import pytest
from conftest import vllm_test_engine

from dcoco.paths import checkpoints_dir

TARGET = "smollm2-135m-instruct"
VOCAB = 2048  # small enough that drafts outside it would show, large enough to draft well
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is 12 times 14?",
    "Explain in two sentences what a compiler does.",
]
MAX_TOKENS = 40
ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def _install(worker) -> None:
    """Log every draft the drafter returns (its logits' argmax, or the token ids get_top_tokens
    hands over) and the width the head reads."""
    model = worker.model_runner.drafter.model
    model.dcoco_test_drafts, model.dcoco_test_widths = [], []
    compute_logits, get_top_tokens = model.compute_logits, model.get_top_tokens

    def logged(hidden_states):
        logits = compute_logits(hidden_states)
        if logits is not None:
            model.dcoco_test_drafts.extend(logits.argmax(-1).tolist())
        return logits

    def logged_ids(hidden_states):
        ids = get_top_tokens(hidden_states)
        model.dcoco_test_drafts.extend(ids.tolist())
        return ids

    model.compute_logits, model.get_top_tokens = logged, logged_ids
    head = getattr(model, "head", None)
    if head is not None:
        select = head.select

        def logged_select(hidden, logits, anchor_ids, **rule):
            model.dcoco_test_widths.append(logits.shape[-1])
            return select(hidden, logits, anchor_ids, **rule)

        head.select = logged_select


def _read(worker) -> dict:
    model = worker.model_runner.drafter.model
    return {
        "drafts": list(model.dcoco_test_drafts),
        "widths": sorted(set(model.dcoco_test_widths)),
        "head_rows": int(model.lm_head.weight.shape[0]),
        "compiled": getattr(getattr(model, "_select", None), "compiled", False),
    }


def _generate(speculative: dict | None) -> tuple[list[list[int]], dict | None]:
    from vllm import SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    from dcoco.models.target.loading import resolve_target

    llm = vllm_test_engine(str(resolve_target(TARGET)), speculative, 4, disable_log_stats=False)
    try:
        if speculative:
            llm.collective_rpc(_install)
        messages = [[{"role": "user", "content": p}] for p in PROMPTS]
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        outputs = llm.chat(messages, params, use_tqdm=False)
        record = llm.collective_rpc(_read)[0] if speculative else None
        if record is not None:
            accepted = [m for m in llm.get_metrics() if m.name.endswith("num_accepted_tokens")]
            record["accepted"] = sum(m.value for m in accepted)
        return [list(o.outputs[0].token_ids) for o in outputs], record
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


@pytest.mark.vllm
def test_a_draft_vocabulary_drafts_inside_it_and_keeps_greedy_output(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    from dcoco.models.drafter.draft_vocab import read_ranking
    from dcoco.models.target.loading import resolve_target
    from dcoco.serving.checkpoint_view import ServedVocab, served_view

    for key, value in {**ENV, "DCOCO_CACHE_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    token_ids = read_ranking(checkpoints_dir() / TARGET, 49_152)[:VOCAB]
    vocab = ServedVocab(token_ids, resolve_target(TARGET))
    plain, _ = _generate(None)
    kept = set(token_ids.tolist())
    # vLLM's argmax over the spread logits for one; for the other the token ids from
    # get_top_tokens (as `dcoco serve` configures it)
    # and the corrector's pick compiled (dcoco.models.heads.head_compile), as `dcoco serve` has it
    cases = (("dflash-mask", None, False), ("dcoco-joint-12k", VOCAB, True))
    for checkpoint, width, served_as in cases:
        model = served_view(checkpoints_dir() / TARGET / checkpoint, None, vocab, served_as)
        speculative = {"method": "dflash", "model": str(model), "num_speculative_tokens": 7,
                       "use_local_argmax_reduction": served_as}  # fmt: skip
        ids, record = _generate(speculative)
        assert ids == plain, checkpoint
        assert record["head_rows"] == VOCAB  # vLLM kept the view's rows, not the target's head
        assert record["drafts"] and set(record["drafts"]) <= kept, checkpoint
        assert record["accepted"] > 0, checkpoint
        assert record["widths"] == ([] if width is None else [width])  # the corrector's columns
        assert record["compiled"] == served_as, checkpoint
        # the drafts are worth verifying: the vocabulary holds the tokens the target writes
        written = [token for reply in plain for token in reply]
        assert sum(token in kept for token in written) > 0.8 * len(written)
