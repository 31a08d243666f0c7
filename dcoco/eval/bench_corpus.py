"""The replies of a `dcoco bench` run as a corpus: `dcoco heldout --bench-run DIR` scores drafter
methods, selection rules and ablations on exactly the prompts a benchmark decoded.

Greedy decoding is lossless, so every method's output is plain decoding's output; drafting after
each position of plain's T=0 replies (teacher-forced, the context the engine would have there)
gives every method's acceptance on those prompts without decoding them again. A later turn's
prompt is rebuilt as the bench built it: earlier user turns and plain's own earlier answers.
"""

from __future__ import annotations

import json
from pathlib import Path

from dcoco.config import config_from_dict
from dcoco.data.distill import Sample
from dcoco.errors import DcocoError
from dcoco.eval.bench import CONFIG_FILE, BenchConfig, load_bench_prompts, turn_messages
from dcoco.eval.samples import read_samples


def bench_samples(run_dir: str | Path, target, method: str = "plain") -> list[Sample]:
    """One Sample per (prompt, turn) that `method` answered at T=0 in the run at `run_dir`;
    its id is `<suite>/<prompt id>/<turn>`."""
    run = Path(run_dir)
    if not (run / CONFIG_FILE).is_file():
        raise DcocoError(f"{run} is not a `dcoco bench` run: no {CONFIG_FILE}")
    stored = json.loads((run / CONFIG_FILE).read_text())["config"]
    config = config_from_dict(BenchConfig, stored)
    prompts = {(prompt.suite, prompt.id): prompt for prompt in load_bench_prompts(config)}
    replies = {
        (r["suite"], r["id"], r["turn"]): r
        for r in read_samples(run)
        if r["method"] == method and float(r["temperature"]) == 0.0
    }
    if not replies:
        raise DcocoError(f"{run} holds no T=0 samples of method '{method}'")
    samples = []
    for (suite, prompt_id, turn), record in replies.items():
        prompt = prompts.get((suite, prompt_id))
        if prompt is None:
            raise DcocoError(f"{run}: sample {suite}/{prompt_id} is not among the run's prompts")
        earlier = [replies.get((suite, prompt_id, number)) for number in range(1, turn)]
        if None in earlier:
            raise DcocoError(f"{run}: {suite}/{prompt_id} turn {turn} lacks an earlier turn")
        messages = turn_messages(prompt, turn, [answer["text"] for answer in earlier])
        prompt_ids = target.encode_chat(messages, chat=config.chat)
        samples.append(
            Sample(f"{suite}/{prompt_id}/{turn}", tuple(prompt_ids), tuple(record["new_ids"]))
        )
    return samples
