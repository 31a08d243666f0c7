"""`dcoco compare`: several methods on the same prompts, interleaved prompt by prompt, one run.

Interleaving makes machine drift hit every method alike; one warm-up prompt per method is run
first and not counted. Speedup is plain's time per token over the method's, pooled over the same
prompts, so it compares like with like through the same engine.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dcoco.config import Command
from dcoco.data.jsonl import iter_jsonl
from dcoco.decode.auto_precision import setting_label
from dcoco.decode.session import DecodeConfig, open_target
from dcoco.errors import DcocoError
from dcoco.eval.bench_rows import RowTargets, make_row_engine, ours_at_run_precision, parse_row
from dcoco.eval.metrics import summarize, temperature_key
from dcoco.eval.report import overall_table
from dcoco.paths import portable_record

BUILTIN_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "A farmer has 12 cows. He buys 5 more and then sells 3. How many cows does he have now? "
    "Please reason step by step.",
    "What are some good tips for sleeping better at night?",
    "Add type hints and a docstring to this function, and return the whole function:\n"
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
    "    return total / len(values)",
    "Summarise this paragraph in two sentences: The city council met on Tuesday to discuss the "
    "new park. Residents asked for more trees, a playground and a quiet area for reading. The "
    "council agreed to plant trees first and to build the playground next year.",
    "List five fruits that are high in vitamin C, one per line, each with a short reason.",
]


@dataclass
class CompareConfig(DecodeConfig):
    methods: tuple[str, ...] = ("plain", "pld")  # METHOD[%DTYPE] or a peer; the 1st is the baseline
    temperature: float = 0.0  # 0 = greedy
    prompts: str = ""  # JSONL with `turns` (first turn used) or `prompt`; empty = built-in prompts
    limit: int = 0  # use at most this many prompts; 0 = all
    warmup: bool = True  # one uncounted warm-up generation per method
    output: str = ""  # write per-sample records and the summary as JSON here


def load_prompts(path: str, limit: int) -> list[str]:
    if not path:
        prompts = list(BUILTIN_PROMPTS)
    else:
        prompts = []
        for where, record in iter_jsonl(path):
            try:
                prompts.append(record["turns"][0] if "turns" in record else record["prompt"])
            except (KeyError, IndexError, TypeError) as error:
                raise DcocoError(f"{where}: expected JSON with `turns` or `prompt`") from error
    return prompts[:limit] if limit > 0 else prompts


def run(config: CompareConfig) -> int:
    rows = [parse_row(m) for m in config.methods if m.strip()]
    methods = [row.name for row in rows]
    if not methods:
        raise DcocoError("--methods is empty: give comma-separated method names")
    sampling = config.sampling(config.temperature)
    prompts = load_prompts(config.prompts, config.limit)
    target = open_target(config, ours_at_run_precision(rows))
    targets = RowTargets(config, target)
    engines = {row.name: make_row_engine(row, targets) for row in rows}
    encoded = [target.encode_chat(prompt, chat=config.chat) for prompt in prompts]
    if config.warmup:
        for engine in engines.values():
            engine.generate(encoded[0], min(32, config.max_new_tokens), sampling, config.seed)

    records = []
    for index, prompt_ids in enumerate(encoded):
        for method, engine in engines.items():
            result = engine.generate(prompt_ids, config.max_new_tokens, sampling, config.seed)
            # the bench record shape, so that the bench metrics apply; only `overall` is shown
            records.append(
                {
                    "method": method,
                    "temperature": config.temperature,
                    "suite": "compare",
                    "category": "chat",
                    "id": str(index),
                    "turn": 1,
                    "new_ids": result.new_ids,
                    **result.stats.summary(),
                }
            )
            print(
                f"prompt {index + 1}/{len(encoded)} {method:>8}: "
                f"{result.stats.tokens_per_s:6.1f} tok/s  tau {result.stats.tau:5.2f}",
                file=sys.stderr,
            )

    summary = summarize(records, baseline=methods[0])
    precision = setting_label(target.precision, target.head_dtype)
    print(
        f"target {config.target} | precision {precision} ({target.attention} attention, "
        f"{target.matmul} matmul) | "
        f"T={config.temperature} | max new tokens {config.max_new_tokens} | "
        f"drafts per cycle {config.num_draft_tokens}"
    )
    if target.precision == "int8":
        print("int8: weight-only int8 weights, a different target: compare with plain at int8 only")
    tkey = temperature_key(config.temperature)
    print("\n".join(overall_table(summary, tkey)))
    for method, engine in engines.items():
        policy = getattr(engine, "draft_length", None)  # auto's; peers and fixed k have none
        if policy:
            print(f"{method}: auto chose k {policy.describe()}")
            print(f"{method}: auto's {policy.ledger.describe()}")
    print(fastest_line(summary["results"][tkey], methods[0]))
    if config.output:
        config_record = portable_record(asdict(config))
        output = {"config": config_record, "summary": summary, "records": records}
        Path(config.output).write_text(json.dumps(output))
    return 0


def fastest_line(results: dict, baseline: str) -> str:
    """The method with the most tokens/s, and its speed over the baseline's."""
    rates = {method: entry["overall"]["tokens_per_s"] for method, entry in results.items()}
    best = max(rates, key=rates.get)
    ratio = rates[best] / rates[baseline] if rates.get(baseline) else float("nan")
    return f"fastest: {best}, {rates[best]:.1f} tok/s ({ratio:.2f}x {baseline})"


COMMAND = Command(
    "compare",
    "plain vs speculative methods on a few prompts, interleaved, one run",
    CompareConfig,
    run,
)
