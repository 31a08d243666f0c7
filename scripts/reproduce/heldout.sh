#!/usr/bin/env bash
# results/smollm2-heldout: every drafter method, selection rule and ablation on the same held-out
# blocks of the shared corpus (no decoding). The ablation checkpoints come from train_heads.sh.
# Usage: scripts/reproduce/heldout.sh   (env: METHODS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
DEFAULT=dflash@dflash-base,dflash,dcoco,dcoco@dcoco-dropin,dcoco:global@dcoco-dropin
DEFAULT+=,dcoco:discounted@dcoco-dropin,dcoco@runs/dcoco-nopair/dcoco
DEFAULT+=,dcoco@runs/dcoco-nocand/dcoco,dspark,domino
"$DCOCO" heldout --methods "${METHODS:-$DEFAULT}" --feature-cache runs/features \
  --out results/smollm2-heldout
