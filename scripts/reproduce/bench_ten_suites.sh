#!/usr/bin/env bash
# The ten-suite report: every method and the CPU peers on all ten suites at T=0 and T=1, SmolLM2 at
# the default precision (DTYPE=auto) and draft length (DRAFTS=auto), batch 1.
# The prompts are split over SHARDS single-threaded `dcoco bench` processes writing one run (on a
# 2-core CPU two 1-thread processes decode ~1.6x the tokens of one 2-thread process); each shard
# interleaves the methods prompt by prompt. Always --resume: rerun the script to continue a run
# that was stopped; it ends by rebuilding report.md and the plots from every shard's samples.
#
# Usage: scripts/reproduce/bench_ten_suites.sh   (env: METHODS, RUN, RESULTS, SUITES, LIMIT,
#                                                 MAX_TOKENS, TEMPS, DRAFTS, SHARDS, THREADS, LOGS,
#                                                 DTYPE)
# The run is written to $RESULTS/$RUN (RESULTS: results, or a group folder results/<group>; the
# default run goes to results/ten-suites/smollm2-ten-suites).
# DTYPE=fp32 makes every method's T=0 output plain decoding's exactly, so τ compares the
# proposers on the very same replies (in bf16, verify shapes change near-ties and replies part).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
METHODS=${METHODS:-plain,pld,pld-dflash,dflash,dcoco,dspark@dspark-dropin,domino@domino-dropin,hf,hf-pld,llama-cpp}
if [ -z "${RUN:-}" ]; then RUN=smollm2-ten-suites; RESULTS=${RESULTS:-results/ten-suites}; fi
RESULTS=${RESULTS:-results}  # the run goes to $RESULTS/$RUN
SUITES=${SUITES:-all}        # or a comma list, e.g. gsm8k,humaneval,mtbench
LIMIT=${LIMIT:-10}           # prompts per suite (MT-Bench: two turns each)
MAX_TOKENS=${MAX_TOKENS:-256}
TEMPS=${TEMPS:-0,1}
DRAFTS=${DRAFTS:-auto}       # draft tokens per cycle for every drafter method (auto: measured)
SHARDS=${SHARDS:-2}
THREADS=${THREADS:-1}        # torch threads per shard
DTYPE=${DTYPE:-auto}         # auto: the precision dcoco profile picks on this machine
LOGS=${LOGS:-runs}
case ",$METHODS," in *,llama-cpp,*) make -s llama-cpp ;; esac
mkdir -p "$LOGS"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
for ((shard = 0; shard < SHARDS; shard++)); do
  .venv/bin/dcoco bench --methods "$METHODS" --suites "$SUITES" --limit "$LIMIT" \
      --max-new-tokens "$MAX_TOKENS" --temperatures "$TEMPS" --num-draft-tokens "$DRAFTS" \
      --dtype "$DTYPE" --results-dir "$RESULTS" --run-name "$RUN" --resume --no-plots \
      --shards "$SHARDS" --shard "$shard" --threads "$THREADS" > "$LOGS/bench-ten-$shard.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
.venv/bin/dcoco bench-report "$RESULTS/$RUN"
exit "$status"
