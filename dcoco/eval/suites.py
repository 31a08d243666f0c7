"""Benchmark prompt suites: JSONL files -> templated, deterministically sampled prompts.

A suite file holds one `{id, suite, category, turns, reference?}` object a line (the format of
`shared/data`, see its MANIFEST). `turns` is the raw user text; the DFlash harness templates
(`z-lab/dflash` benchmark.py, plus DeepSpec's SWE-bench one) are applied here, at load time, so
that the numbers compare with the published ones.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from dcoco import paths
from dcoco.errors import DcocoError

SUITES = (
    "gsm8k",
    "math500",
    "aime24",
    "aime25",
    "humaneval",
    "mbpp",
    "livecodebench",
    "swebench",
    "mtbench",
    "alpaca",
)
CATEGORIES = ("math", "code", "chat")
SAMPLE_SEED = 0  # fixed, so that every run with the same --limit sees the same prompts

_MATH = "{q}\nPlease reason step by step, and put your final answer within \\boxed{}."
TEMPLATES = {
    "gsm8k": _MATH,
    "math500": _MATH,
    "aime24": _MATH,
    "aime25": _MATH,
    "humaneval": "Write a solution to the following problem and make sure that it passes the "
    "tests:\n```python\n{q}\n```",
    "swebench": "Problem Statement:\n{q}\nPlease fix the issue described above.",
}  # every other suite (mbpp, livecodebench, mtbench, alpaca, custom ones) is used as is


@dataclass(frozen=True)
class Prompt:
    id: str
    suite: str
    category: str  # math | code | chat
    turns: tuple[str, ...]  # templated user turns; a later turn follows the model's own answer


def apply_template(suite: str, text: str) -> str:
    template = TEMPLATES.get(suite)
    # str.replace, not str.format: both the templates and the prompts contain braces
    return template.replace("{q}", text) if template else text


def parse_suites(spec: str) -> list[str] | None:
    """`all` -> None (no filter), else the comma-separated names."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise DcocoError("--suites is empty: give `all` or comma-separated suite names")
    return None if names == ["all"] else names


def read_suite_file(path: Path, default_suite: str) -> list[Prompt]:
    """All prompts of one JSONL file; records without `suite` belong to `default_suite`."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            turns = record["turns"]
            suite = record.get("suite") or default_suite
            if not turns or not all(isinstance(turn, str) for turn in turns):
                raise TypeError("turns must be a non-empty list of strings")
            prompt = Prompt(
                id=str(record.get("id", f"{suite}-{number}")),
                suite=suite,
                category=record["category"],
                turns=tuple(apply_template(suite, turn) for turn in turns),
            )
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
            raise DcocoError(
                f"{path}:{number}: expected JSON with `turns` (a list of strings) and "
                f"`category` ({error})"
            ) from error
        if prompt.category not in CATEGORIES:
            raise DcocoError(f"{path}:{number}: category must be one of {', '.join(CATEGORIES)}")
        prompts.append(prompt)
    return prompts


def sample_prompts(prompts: list[Prompt], limit: int) -> list[Prompt]:
    """At most `limit` prompts per suite, a fixed random choice kept in file order."""
    by_suite: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_suite.setdefault(prompt.suite, []).append(prompt)
    chosen = []
    for suite, members in by_suite.items():
        ids = [prompt.id for prompt in members]
        if len(set(ids)) != len(ids):
            raise DcocoError(f"suite {suite} repeats an id; resume and matching need unique ids")
        if 0 < limit < len(members):
            keep = sorted(random.Random(SAMPLE_SEED).sample(range(len(members)), limit))
            members = [members[index] for index in keep]
        chosen.extend(members)
    return chosen


def load_prompts(data_dir: str, prompts_file: str, suites: str, limit: int) -> list[Prompt]:
    """The prompts of a run: `prompts_file` if given, else `<data_dir>/<suite>.jsonl` per suite."""
    wanted = parse_suites(suites)
    if prompts_file:
        file = Path(prompts_file)
        if not file.is_file():
            raise DcocoError(f"prompts file not found: {prompts_file}")
        prompts = read_suite_file(file, default_suite=file.stem)
        if wanted is not None:
            prompts = [prompt for prompt in prompts if prompt.suite in wanted]
        if not prompts:
            raise DcocoError(f"{prompts_file} has no prompts of the suites {suites}")
        return sample_prompts(prompts, limit)

    directory = Path(data_dir) if data_dir else paths.data_dir()
    if not directory.is_dir():
        raise DcocoError(
            f"no suite data at {directory}: pass --data-dir DIR (holding <suite>.jsonl) or "
            "--prompts FILE.jsonl"
        )
    prompts = []
    for suite in wanted or SUITES:
        file = directory / f"{suite}.jsonl"
        if not file.is_file():
            raise DcocoError(f"suite '{suite}' not found: {file} does not exist")
        prompts.extend(read_suite_file(file, default_suite=suite))
    return sample_prompts(prompts, limit)
