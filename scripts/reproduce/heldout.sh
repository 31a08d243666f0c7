#!/usr/bin/env bash
# results/smollm2-heldout: every drafter method, selection rule and ablation on the same held-out
# blocks of the shared corpus (no decoding). The ablation checkpoints come from train_heads.sh.
# Usage: scripts/reproduce/heldout.sh   (env: METHODS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
DEFAULT=dflash@dflash-base,dflash@dflash-b16,dcoco,dcoco@dcoco-dropin-b16
DEFAULT+=,dcoco:global@dcoco-dropin-b16,dcoco:discounted@dcoco-dropin-b16
DEFAULT+=,dcoco@runs/dcoco-nopair/dcoco,dcoco@runs/dcoco-nocand/dcoco,dspark,domino
"$DCOCO" heldout --methods "${METHODS:-$DEFAULT}" --feature-cache runs/features \
  --out results/smollm2-heldout
