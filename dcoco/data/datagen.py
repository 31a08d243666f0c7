"""`dcoco datagen`: regenerate a distillation corpus with the target itself.

A drafter learns to predict what *its* target says, so the training responses should be the
target's own greedy replies (DFlash and SpecForge regenerate them). Prompts come from a JSONL of
`{id, turns: [user, ...]}` records (`category`/`source` are kept when present); the output is the
corpus format `dcoco train-drafter` reads: `part-NNNN.jsonl` with `{id, source, category, user,
prompt_ids, response_ids, finish}`.

Two engines write the same records. `--engine vllm` (the default wherever vLLM is importable,
here or in `make venv-vllm`'s venv) hands the tokenised prompts to vLLM's offline `LLM.generate`
(dcoco.data.vllm_datagen: continuous batching, `--tensor-parallel-size` GPUs); `--engine hf` is
batched HF `generate` with left padding (prompts sorted by length so padding stays small). Both
append and flush as they go and a rerun skips every id already in the directory, so an
interrupted run resumes where it stopped. Each run appends its provenance (engine and version,
precision, sampling, records, tokens/s) to `<out>/datagen.jsonl`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

from dcoco import paths
from dcoco.config import Command
from dcoco.data.jsonl import iter_jsonl
from dcoco.data.shards import next_part, shard_of
from dcoco.errors import DcocoError
from dcoco.models.target.loading import DEFAULT_TARGET, load_target, resolve_target
from dcoco.models.target.precision import HF_DTYPE_NAMES
from dcoco.models.target.target import TargetModel, encode_chat
from dcoco.paths import portable

PROVENANCE_FILE = "datagen.jsonl"  # one line per run into the directory
ENGINES = ("auto", "vllm", "hf")
RESERVED_CPUS = "VLLM_CPU_NUM_OF_RESERVED_CPU"


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
    engine: str = "auto"  # auto (vllm where importable, else hf) | vllm | hf
    tensor_parallel_size: int = 1  # vllm: GPUs per model
    chunk: int = 256  # vllm: prompts per generate call, each call's replies flushed together
    kv_cache_gib: float = 2.0  # vllm: KV-cache memory in GiB (0 = vLLM sizes it from free memory)
    temperature: float = 0.0  # 0 = greedy replies; > 0 = sampled at this temperature, no top-k/p
    seed: int = 0  # sampling seed of the vllm engine (replies depend on batching) or each hf batch
    shard: str = "0/1"  # I/N: answer the prompts of shard I of N (by id), parts named apart


def run(config: DatagenConfig) -> int:
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    if config.temperature < 0:
        raise DcocoError(f"--temperature must be 0 (greedy) or above, got {config.temperature}")
    if config.engine not in ENGINES:
        raise DcocoError(f"--engine must be one of {', '.join(ENGINES)}, got '{config.engine}'")
    prompts = shard_of(read_prompts(config.prompts), config.shard)
    python = _vllm_python(config.engine)
    started = time.perf_counter()
    if python is None:
        target = load_target(config.target, config.dtype, config.device or None)
        written = generate_corpus(target, prompts, config)
        summary = {"engine": "hf", "version": _transformers_version(), "records": written,
                   "new_tokens": _new_tokens(Path(config.out), written)}  # fmt: skip
    else:
        summary = generate_with_vllm(python, prompts, config)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    record = write_provenance(config, summary)
    print(
        f"dcoco: wrote {summary['records']} records to {config.out} with {summary['engine']} "
        f"({record['tokens_per_s']:.1f} new tokens/s)",
        file=sys.stderr,
    )
    return 0


def _vllm_python(engine: str) -> str | None:
    """The interpreter that runs vLLM, or None for the HF engine."""
    if engine == "hf":
        return None
    try:
        return paths.find_vllm_python()
    except DcocoError:
        if engine == "vllm":
            raise
        return None


def pending(prompts: list[dict], out: Path, limit: int) -> list[dict]:
    """The prompts whose ids `out` does not hold yet, at most `limit` (0: all)."""
    done = done_ids(out)
    todo = [p for p in prompts if p["id"] not in done]
    return todo[:limit] if limit > 0 else todo


def generate_with_vllm(python: str, prompts: list[dict], config: DatagenConfig) -> dict:
    """Tokenise here (the target's chat template), generate in vLLM's interpreter."""
    from transformers import AutoTokenizer

    model = resolve_target(config.target)
    tokenizer = AutoTokenizer.from_pretrained(model)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    records = [
        {"id": p["id"], "source": p.get("source", ""), "category": p.get("category", ""),
         "user": p["user"], "prompt_ids": encode_chat(tokenizer, p["user"], chat=config.chat)}
        for p in pending(prompts, out, config.limit)
    ]  # fmt: skip
    if not records:
        return {"engine": "vllm", "version": None, "records": 0, "new_tokens": 0}
    longest = max(len(r["prompt_ids"]) for r in records) + config.max_new_tokens
    request = {
        "model": str(model), "dtype": HF_DTYPE_NAMES.get(config.dtype, config.dtype),
        "records": records, "chunk": config.chunk,
        "tensor_parallel_size": config.tensor_parallel_size, "max_model_len": longest,
        "max_new_tokens": config.max_new_tokens, "part": str(next_part(out, config.shard)),
        "enforce_eager": not _on_gpu(config.device),  # CUDA graphs on a GPU; none on a CPU
        "kv_cache_bytes": int(config.kv_cache_gib * (1 << 30)),
        "temperature": config.temperature, "seed": config.seed,
    }  # fmt: skip
    tag = config.shard.replace("/", "of")  # shards sharing `out` keep their own files
    request_file = out / f".vllm-request-{tag}.json"
    summary_file = out / f".vllm-summary-{tag}.json"
    summary_file.unlink(missing_ok=True)
    request_file.write_text(json.dumps({**request, "summary": str(summary_file)}))
    # vLLM-CPU keeps a core for its scheduler; offline batches leave the scheduler mostly idle,
    # and on 2 cores every core for the model ran 1.4x faster (92.5 against 65.4 tokens/s)
    env = {**os.environ, RESERVED_CPUS: os.environ.get(RESERVED_CPUS, "0")}
    child = subprocess.run([python, "-m", "dcoco.data.vllm_datagen", str(request_file)], env=env)
    request_file.unlink(missing_ok=True)
    if child.returncode != 0 or not summary_file.is_file():
        raise DcocoError(
            f"vLLM's generation failed (exit {child.returncode}; its log is above); the records "
            f"written so far stay in {out} and a rerun continues"
        )
    summary = json.loads(summary_file.read_text())
    summary_file.unlink()
    return summary


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


def _on_gpu(device: str) -> bool:
    """Whether vLLM will run on a GPU: `cuda...`, or no device named and CUDA present."""
    return device.startswith("cuda") or (not device and torch.cuda.is_available())


def generate_corpus(target: TargetModel, prompts: list[dict], config: DatagenConfig) -> int:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = pending(prompts, out, config.limit)
    encoded = [(p, target.encode_chat(p["user"], chat=config.chat)) for p in todo]
    encoded.sort(key=lambda item: len(item[1]))
    part = next_part(out, config.shard)
    written = 0
    with part.open("a") as sink, tqdm(total=len(encoded), unit="prompt") as bar:
        for start in range(0, len(encoded), config.batch_size):
            batch = encoded[start : start + config.batch_size]
            replies = generate_batch(
                target,
                [ids for _, ids in batch],
                config.max_new_tokens,
                config.temperature,
                config.seed + start,
            )
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
    target: TargetModel,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[tuple[list[int], str]]:
    """Replies to a batch of token-id prompts, greedy or sampled at `temperature` (the full
    distribution: no top-k or top-p): (response ids, "eos" | "length") each."""
    sampling = {"do_sample": False}
    if temperature > 0:
        torch.manual_seed(seed)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
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
        **sampling,
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


def write_provenance(config: DatagenConfig, summary: dict) -> dict:
    """Append this run's record to `<out>/datagen.jsonl`; returns it."""
    seconds = summary["seconds"]
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **summary,
        "tokens_per_s": summary["new_tokens"] / seconds if seconds > 0 else 0.0,
        "sampling": f"T = {config.temperature:g}" if config.temperature > 0 else "greedy",
        "config": {
            **asdict(config),
            "prompts": portable(config.prompts),
            "out": portable(config.out),
        },
    }
    with (Path(config.out) / PROVENANCE_FILE).open("a") as sink:
        sink.write(json.dumps(record) + "\n")
    return record


def _new_tokens(out: Path, last: int) -> int:
    """New tokens of the `last` records written to `out`'s newest part (the HF engine's run)."""
    parts = sorted(out.glob("part-*.jsonl"))
    if not last or not parts:
        return 0
    lines = parts[-1].read_text().splitlines()[-last:]
    return sum(len(json.loads(line)["response_ids"]) for line in lines)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


COMMAND = Command(
    "datagen",
    "regenerate a distillation corpus: the target's own greedy (or sampled) replies",
    DatagenConfig,
    run,
)
