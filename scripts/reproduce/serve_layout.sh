#!/usr/bin/env bash
# `dcoco serve --method plain` at one stream, before and after the layout choice: each layout by
# hand (vLLM's default binding, then all cores), then `--layout auto` (which times both once per
# machine, caches the winner and says which). The client is the openai SDK (from the vLLM venv):
# a warm-up, then PROMPTS greedy replies of MAX_TOKENS, one at a time. Nothing else may run.
#
# Usage: scripts/reproduce/serve_layout.sh   (env: OUT, PORT, PROMPTS, MAX_TOKENS, LOGS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv venv-vllm
OUT=${OUT:-results/serve/smollm2-serve-layout}
PORT=${PORT:-8021}
PROMPTS=${PROMPTS:-8}
MAX_TOKENS=${MAX_TOKENS:-128}
VLLM_PY="${DCOCO_VLLM_VENV:-$PWD/.venv-vllm}/bin/python"
LOGS=${LOGS:-${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}/logs}  # server logs name local paths
mkdir -p "$OUT" "$LOGS"
: > "$OUT/tokens_per_s.jsonl"
for layout in vllm-default all-cores auto; do
  # its own process group, so that stopping it stops vLLM's EngineCore and worker too
  setsid .venv/bin/dcoco serve --method plain --layout "$layout" --port "$PORT" \
    > "$LOGS/serve-$layout.log" 2>&1 &
  server=$!
  "$VLLM_PY" - "$PORT" "$layout" "$PROMPTS" "$MAX_TOKENS" >> "$OUT/tokens_per_s.jsonl" <<'PY'
import json, sys, time
from openai import OpenAI
port, layout, prompts, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=900)
deadline = time.monotonic() + 1800  # --layout auto first times two probe servers
while True:
    try:
        model = client.models.list().data[0].id
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(3)
topics = ["a lighthouse", "the moon", "a bicycle", "bread", "rain", "a library", "chess", "tea"]
ask = lambda topic, n: client.chat.completions.create(  # noqa: E731
    model=model, messages=[{"role": "user", "content": f"Write a short story about {topic}."}],
    max_tokens=n, temperature=0)
ask("a cat", 8)  # warm-up
tokens, start = 0, time.perf_counter()
for topic in topics[:prompts]:
    tokens += ask(topic, max_tokens).usage.completion_tokens
seconds = time.perf_counter() - start
print(json.dumps({"layout": layout, "tokens": tokens, "seconds": round(seconds, 2),
                  "tokens_per_s": round(tokens / seconds, 2)}))
PY
  kill -- -"$server"; wait "$server" 2>/dev/null || true
  while kill -0 -- -"$server" 2>/dev/null; do sleep 1; done
done
grep -h "dcoco: vLLM layout" "$LOGS"/serve-*.log | tee "$OUT/chosen.txt" || true
cat "$OUT/tokens_per_s.jsonl"
