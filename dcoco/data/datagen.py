"""`dcoco datagen`: regenerate a distillation corpus with the target itself.

A drafter learns to predict what *its* target says, so the training responses should be the
target's own greedy replies (DFlash and SpecForge regenerate them). Prompts come from a JSONL of
`{id, turns: [user, ...]}` records (`category`/`source` are kept when present); the output is the
corpus format `dcoco train-drafter` reads: `part-NNNN.jsonl` with `{id, source, category, user,
prompt_ids, response_ids, finish}`.

Batched HF `generate` with left padding (prompts sorted by length so padding stays small). Each
batch is appended and flushed as it finishes; a rerun skips every id already in the directory, so
an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dcoco.config import Command
from dcoco.data.jsonl import iter_jsonl
from dcoco.errors import DcocoError
from dcoco.models.loading import DEFAULT_TARGET, load_target
from dcoco.models.target import TargetModel


@dataclass
class DatagenConfig:
    prompts: str = ""  # JSONL of {id, turns: [user, ...], category?, source?}
    out: str = "runs/corpus"  # corpus directory (part-*.jsonl); reruns resume into it
    target: str = DEFAULT_TARGET  # embedded name or Hugging Face model directory
    dtype: str = "bf16"  # the target's dtype (bf16, fp32, fp16)
    device: str = ""  # cpu or cuda; empty = CUDA when present, else CPU
    threads: int = 0  # torch CPU threads; 0 = torch's default
    batch_size: int = 16  # prompts per batched `generate`
    max_new_tokens: int = 384  # reply length, at most
    limit: int = 0  # generate for at most this many prompts (after skipping done ones); 0 = all
    chat: bool = True  # apply the target's chat template


def run(config: DatagenConfig) -> int:
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    prompts = read_prompts(config.prompts)
    target = load_target(config.target, config.dtype, config.device or None)
    written = generate_corpus(target, prompts, config)
    print(f"dcoco: wrote {written} records to {config.out}", file=sys.stderr)
    return 0


def read_prompts(path: str) -> list[dict]:
    records = []
    for where, record in iter_jsonl(path):
        try:
            records.append({**record, "id": str(record["id"]), "user": record["turns"][0]})
        except (KeyError, IndexError, TypeError) as error:
            raise DcocoError(f"{where}: expected JSON with `id` and `turns`") from error
    return records


def done_ids(out: Path) -> set[str]:
    ids = set()
    for part in sorted(out.glob("part-*.jsonl")):
        for line in part.read_text().splitlines():
            try:
                ids.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError):
                continue  # a torn last line from an interrupted run: that record is redone
    return ids


def generate_corpus(target: TargetModel, prompts: list[dict], config: DatagenConfig) -> int:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    done = done_ids(out)
    todo = [p for p in prompts if p["id"] not in done]
    if config.limit > 0:
        todo = todo[: config.limit]
    encoded = [(p, target.encode_chat(p["user"], chat=config.chat)) for p in todo]
    encoded.sort(key=lambda item: len(item[1]))
    part = out / f"part-{len(list(out.glob('part-*.jsonl'))):04d}.jsonl"
    written = 0
    with part.open("a") as sink, tqdm(total=len(encoded), unit="prompt") as bar:
        for start in range(0, len(encoded), config.batch_size):
            batch = encoded[start : start + config.batch_size]
            replies = generate_batch(target, [ids for _, ids in batch], config.max_new_tokens)
            for (prompt, prompt_ids), (response_ids, finish) in zip(batch, replies, strict=True):
                record = {
                    "id": prompt["id"],
                    "source": prompt.get("source", ""),
                    "category": prompt.get("category", ""),
                    "user": prompt["user"],
                    "prompt_ids": prompt_ids,
                    "response_ids": response_ids,
                    "finish": finish,
                }
                sink.write(json.dumps(record) + "\n")
            sink.flush()
            written += len(batch)
            bar.update(len(batch))
    return written


@torch.inference_mode()
def generate_batch(
    target: TargetModel, prompts: list[list[int]], max_new_tokens: int
) -> list[tuple[list[int], str]]:
    """Greedy replies to a batch of token-id prompts: (response ids, "eos" | "length") each."""
    pad = min(target.stop_ids) if target.stop_ids else 0
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):  # left padding: every prompt ends at the same column
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    generated = target.model.generate(
        input_ids=input_ids.to(target.device),
        attention_mask=attention_mask.to(target.device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(target.stop_ids) or None,
        pad_token_id=pad,
    )[:, width:].tolist()
    replies = []
    for row in generated:
        stop = next((i for i, token in enumerate(row) if token in target.stop_ids), None)
        if stop is None:
            replies.append((row, "length"))
        else:
            replies.append((row[: stop + 1], "eos"))
    return replies


COMMAND = Command(
    "datagen",
    "regenerate a distillation corpus: the target's own greedy replies",
    DatagenConfig,
    run,
)
