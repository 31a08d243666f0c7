"""`--source hf`: the suites straight from the Hugging Face hub, for machines that can reach it.

The dataset names and fields are the ones the DFlash harness loads (plus the usual hub copies of
AIME and SWE-bench Lite). LiveCodeBench and AlpacaEval have no plain one-field copy there, so
they come from the JSONL files only. `datasets` is imported lazily: it is not a dependency.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcoco.errors import DcocoError
from dcoco.eval.suites import SUITES, Prompt, apply_template, parse_suites, sample_prompts


@dataclass(frozen=True)
class HubSuite:
    path: str
    config: str | None
    split: str
    text_field: str
    id_field: str | None  # None = number the rows
    category: str  # mtbench overrides this per row from its `category` column


HUB_SUITES = {
    "gsm8k": HubSuite("openai/gsm8k", "main", "test", "question", None, "math"),
    "math500": HubSuite("HuggingFaceH4/MATH-500", None, "test", "problem", "unique_id", "math"),
    "aime24": HubSuite("HuggingFaceH4/aime_2024", None, "train", "problem", "id", "math"),
    "aime25": HubSuite("MathArena/aime_2025", None, "train", "problem", "problem_idx", "math"),
    "humaneval": HubSuite("openai/openai_humaneval", None, "test", "prompt", "task_id", "code"),
    "mbpp": HubSuite(
        "google-research-datasets/mbpp", "sanitized", "test", "prompt", "task_id", "code"
    ),
    "swebench": HubSuite(
        "princeton-nlp/SWE-bench_Lite", None, "test", "problem_statement", "instance_id", "code"
    ),
    "mtbench": HubSuite(
        "HuggingFaceH4/mt_bench_prompts", None, "train", "prompt", "prompt_id", "chat"
    ),
}
MTBENCH_CATEGORIES = {"math": "math", "coding": "code"}  # every other MT-Bench category is chat


def load_hub_prompts(suites: str, limit: int) -> list[Prompt]:
    try:
        from datasets import load_dataset
    except ImportError as error:
        raise DcocoError(
            "--source hf needs the `datasets` package (pip install datasets); or use the JSONL "
            "suites with --data-dir / --prompts"
        ) from error
    prompts = []
    for suite in parse_suites(suites) or SUITES:
        spec = HUB_SUITES.get(suite)
        if spec is None:
            raise DcocoError(f"suite '{suite}' is not available with --source hf; use --data-dir")
        rows = load_dataset(spec.path, spec.config, split=spec.split)
        for index, row in enumerate(rows):
            text = row[spec.text_field]
            turns = text if isinstance(text, list) else [text]  # mt_bench_prompts holds a list
            category = spec.category
            if suite == "mtbench":
                category = MTBENCH_CATEGORIES.get(row.get("category", ""), "chat")
            row_id = row[spec.id_field] if spec.id_field else index
            prompts.append(
                Prompt(
                    id=f"{suite}-{row_id}",
                    suite=suite,
                    category=category,
                    turns=tuple(apply_template(suite, turn) for turn in turns),
                )
            )
    return sample_prompts(prompts, limit)
