"""The shipped benchmark suites (shared/data, when this checkout has it) and the prompt loader."""

from __future__ import annotations

import json
import sys

import pytest

from dcoco import paths
from dcoco.errors import DcocoError
from dcoco.eval.suites import CATEGORIES, SUITES, load_prompts

BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."

shared_data = pytest.mark.skipif(
    not paths.data_dir().is_dir(), reason="no shared data (see dcoco.paths)"
)


@pytest.fixture(scope="module")
def every_prompt():
    return load_prompts("", "", "all", limit=0)


@shared_data
def test_every_suite_loads_with_unique_ids_and_known_categories(every_prompt):
    assert {prompt.suite for prompt in every_prompt} == set(SUITES)
    for suite in SUITES:
        ids = [prompt.id for prompt in every_prompt if prompt.suite == suite]
        assert ids and len(ids) == len(set(ids)), suite
    assert {prompt.category for prompt in every_prompt} <= set(CATEGORIES)


@shared_data
def test_templates_and_turns(every_prompt):
    by_suite = {}
    for prompt in every_prompt:
        by_suite.setdefault(prompt.suite, []).append(prompt)
    assert all(p.turns[0].endswith(BOXED) for s in ("gsm8k", "aime25") for p in by_suite[s])
    for prompt in by_suite["humaneval"]:
        assert prompt.turns[0].startswith("Write a solution to the following problem")
        assert "```python\n" in prompt.turns[0] and prompt.turns[0].endswith("\n```")
    assert all(p.turns[0].startswith("Problem Statement:\n") for p in by_suite["swebench"])
    assert all(len(p.turns) == 2 for p in by_suite["mtbench"])
    assert all(len(p.turns) == 1 for s in SUITES if s != "mtbench" for p in by_suite[s])


@shared_data
def test_limit_is_a_fixed_sample_in_file_order():
    first = load_prompts("", "", "gsm8k,mtbench", limit=3)
    again = load_prompts("", "", "gsm8k,mtbench", limit=3)
    assert first == again and len(first) == 6
    numbers = [int(p.id.rsplit("-", 1)[1]) for p in first if p.suite == "gsm8k"]
    assert numbers == sorted(numbers) and numbers != [0, 1, 2]


def test_prompts_file_takes_the_suite_from_records_or_the_file_name(tmp_path):
    file = tmp_path / "mine.jsonl"
    rows = [
        {"id": "x", "suite": "gsm8k", "category": "math", "turns": ["1+1?"]},
        {"id": "y", "category": "chat", "turns": ["hi", "and?"]},
    ]
    file.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    prompts = load_prompts("", str(file), "all", limit=0)
    assert [(p.suite, p.turns[0]) for p in prompts] == [("gsm8k", "1+1?" + BOXED), ("mine", "hi")]
    assert [p.suite for p in load_prompts("", str(file), "mine", limit=0)] == ["mine"]


def test_clear_errors(tmp_path):
    with pytest.raises(DcocoError, match="pass --data-dir"):
        load_prompts(str(tmp_path / "absent"), "", "all", limit=1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "category": "poetry", "turns": ["hi"]}\n')
    with pytest.raises(DcocoError, match="category must be one of"):
        load_prompts("", str(bad), "all", limit=1)


def test_hub_source_without_datasets_is_a_clear_error(monkeypatch):
    from dcoco.eval.hf_suites import load_hub_prompts

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(DcocoError, match="needs the `datasets` package"):
        load_hub_prompts("gsm8k", limit=1)
