#!/usr/bin/env bash
# results/smollm2-heads-compare: every drafter method's cycle cost on 3 built-in prompts, 96 new
# tokens, bf16, 3 draft tokens per cycle, 1 thread, interleaved in one run.
# Usage: scripts/reproduce/compare_heads.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
OUT=results/smollm2-heads-compare
mkdir -p "$OUT"
"$DCOCO" compare --methods plain,dflash@dflash-b16,dcoco@dcoco-dropin-b16,dcoco,dspark,domino \
  --limit 3 --max-new-tokens 96 --num-draft-tokens 3 --threads 1 --output "$OUT/compare.json" \
  2>&1 | tee "$OUT/compare.log"
