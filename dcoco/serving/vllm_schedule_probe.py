"""The vLLM side of `dcoco serve --draft-schedule auto`, run by the vLLM interpreter:
`python -m dcoco.serving.vllm_schedule_probe REQUEST.json`.

For each draft length K of the request, one offline vLLM engine (this process, so the numbers
are the worker's alone) serves the method with every batch size scheduled at K, and times
batches of chat requests at each temperature the request lists for that K (greedy at T = 0,
sampled at T = 1, a fixed seed per request), all running `max_tokens` tokens (EOS ignored, so a
batch keeps its size to the end). Small batches are repeated until they have produced at least
`min_tokens` tokens. The tokens/s of every (T, K, batch) cell goes to the request's `summary`
file as JSON (vLLM's logging shares stdout). dcoco.serving.draft_schedule turns the grids into
schedules.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

# Our own prompts (no benchmark suite's): code, arithmetic, explanation and chat, so the probe's
# acceptance is a mix like a server's.
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is 17 times 23? Show the steps.",
    "Explain what a hash table is to a beginner.",
    "Give me three ideas for a rainy weekend.",
    "Write a SQL query that counts orders per customer.",
    "A train travels 60 km in 45 minutes. What is its speed in km/h?",
    "Summarise the water cycle in a few sentences.",
    "Write a short poem about autumn leaves.",
    "Write a JavaScript function that removes duplicates from an array.",
    "If a shirt costs 25 dollars after a 20% discount, what was the original price?",
    "What are the main differences between TCP and UDP?",
    "Suggest a name for a coffee shop and explain it.",
    "Write a bash command that finds the ten largest files in a directory.",
    "Sam has 3 boxes of 12 pencils and gives away 7. How many are left?",
    "Why is the sky blue?",
    "Write a polite email declining a meeting invitation.",
    "Implement binary search in Python.",
    "What is the sum of the integers from 1 to 100?",
    "Explain recursion with an example.",
    "List five healthy breakfast options.",
    "Write a Python class for a simple bank account.",
    "A rectangle is 8 cm by 5 cm. What are its area and perimeter?",
    "How does a vaccine train the immune system?",
    "Write a haiku about the sea.",
    "Write a function in C that reverses a string in place.",
    "Convert 98.6 degrees Fahrenheit to Celsius.",
    "What causes the seasons on Earth?",
    "Give tips for learning a new language.",
    "Write a Python script that reads a CSV file and prints each row.",
    "A recipe needs 3 eggs for 4 people. How many eggs for 10 people?",
    "Describe how photosynthesis works.",
    "Plan a one-day trip to a city you like.",
)


def measure(request: dict) -> dict:
    """tokens/s per temperature, draft length and batch size: {"rates": {T: {K: {batch: r}}}}."""
    import vllm

    rates: dict[str, dict[str, dict[str, float]]] = {}
    for k in sorted({k for ks in request["draft_lengths"].values() for k in ks}):
        temperatures = [t for t, ks in request["draft_lengths"].items() if k in ks]
        for temperature, cells in _one_engine(request, k, temperatures).items():
            rates.setdefault(temperature, {})[str(k)] = cells
            print(f"dcoco: T={temperature} K={k}: {cells}", file=sys.stderr, flush=True)
    return {"vllm": vllm.__version__, "rates": rates}


def _one_engine(request: dict, k: int, temperatures: list[str]) -> dict[str, dict[str, float]]:
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    speculative = {
        **request["speculative"],
        "num_speculative_tokens_per_batch_size": [[1, 1 << 16, k]],
    }
    llm = LLM(
        model=request["model"],
        dtype=request["dtype"],
        max_model_len=request["max_model_len"],
        enforce_eager=True,
        kv_cache_memory_bytes=request["kv_cache_bytes"],
        speculative_config=speculative,
        max_num_seqs=max(request["batches"] + request["sampled_batches"]),
        seed=0,
    )
    try:
        messages = [[{"role": "user", "content": p}] for p in PROMPTS]
        llm.chat(messages[:2], _params(request, 0.0, 2), use_tqdm=False)  # warm-up
        return {t: _time_batches(llm, request, messages, float(t)) for t in temperatures}
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


def _params(request: dict, temperature: float, batch: int) -> list:
    from vllm import SamplingParams

    return [
        SamplingParams(
            temperature=temperature, max_tokens=request["max_tokens"], ignore_eos=True, seed=i
        )
        for i in range(batch)
    ]


def _time_batches(llm, request: dict, messages: list, temperature: float) -> dict[str, float]:
    rates = {}
    batches = request["batches"] if temperature == 0 else request["sampled_batches"]
    for batch in batches:
        rounds = max(1, -(-request["min_tokens"] // (batch * request["max_tokens"])))
        chosen = [messages[i % len(messages)] for i in range(batch)]
        params = _params(request, temperature, batch)
        started, produced = time.perf_counter(), 0
        for _ in range(rounds):
            outputs = llm.chat(chosen, params, use_tqdm=False)
            produced += sum(len(o.outputs[0].token_ids) for o in outputs)
        rates[str(batch)] = round(produced / (time.perf_counter() - started), 2)
    return rates


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    summary = measure(request)
    Path(request["summary"]).write_text(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
