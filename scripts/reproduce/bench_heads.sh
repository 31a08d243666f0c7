#!/usr/bin/env bash
# results/smollm2-heads-t0: plain, the drafter and both DCOCO checkpoints, interleaved, T=0, 20
# prompts each of gsm8k, humaneval, mtbench (2 h 23 min on 2 cores); add dspark,domino to METHODS
# for the sequential heads.
# Usage: scripts/reproduce/bench_heads.sh [EXTRA BENCH FLAGS]   (env: METHODS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
METHODS=${METHODS:-plain,dflash@dflash-b16,dcoco@dcoco-dropin-b16,dcoco}
"$DCOCO" bench --methods "$METHODS" --suites gsm8k,humaneval,mtbench --limit 20 \
  --max-new-tokens 256 --temperatures 0 --num-draft-tokens 3 --run-name smollm2-heads-t0 "$@"
