#!/usr/bin/env bash
# results/smollm2-heads-ablations: the selection rules and corrector ablations on the prompts
# bench_heads.sh decoded (plain's T=0 replies, 64 anchors a reply; no decoding).
# Usage: scripts/reproduce/heldout_bench.sh   (env: METHODS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
DEFAULT=dflash@dflash-b16,dcoco@dcoco-dropin-b16,dcoco:global@dcoco-dropin-b16
DEFAULT+=,dcoco:discounted@dcoco-dropin-b16
DEFAULT+=,dcoco@runs/dcoco-nopair/dcoco,dcoco@runs/dcoco-nocand/dcoco,dcoco
"$DCOCO" heldout --methods "${METHODS:-$DEFAULT}" --bench-run results/smollm2-heads-t0 \
  --anchors-per-seq 64 --slots 3,15 --feature-cache runs/features-bench \
  --out results/smollm2-heads-ablations
