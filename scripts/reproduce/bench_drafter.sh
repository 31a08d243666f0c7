#!/usr/bin/env bash
# results/smollm2-dflash-t0: plain vs the stage-0 drafter (then the base of dflash-b16), 20 prompts each
# of gsm8k, humaneval, mtbench, T=0, 256 new tokens.
# Usage: scripts/reproduce/bench_drafter.sh [EXTRA BENCH FLAGS]
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
"$DCOCO" bench --methods plain,dflash --drafter checkpoints/smollm2-135m-instruct/dflash-base \
  --suites gsm8k,humaneval,mtbench --limit 20 --max-new-tokens 256 --temperatures 0 \
  --run-name smollm2-dflash-t0 "$@"
