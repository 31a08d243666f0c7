#!/usr/bin/env bash
# Copies the runs of train_heads.sh into checkpoints/smollm2-135m-instruct/ (dflash-b16, dcoco,
# dcoco-dropin-b16, dspark, domino), each with its training log.
# Usage: scripts/reproduce/ship_heads.sh   (env: RUNS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
RUNS=${RUNS:-runs}
DEST=checkpoints/smollm2-135m-instruct
# run/artefact:checkpoint name
for pair in dflash-cont/drafter:dflash-b16 dcoco-joint/dcoco:dcoco \
    dcoco-dropin/dcoco:dcoco-dropin-b16 dspark/dspark:dspark domino/domino:domino; do
  run=${pair%%/*}; src=$RUNS/${pair%%:*}; dst=$DEST/${pair##*:}
  mkdir -p "$dst" && cp "$src"/* "$RUNS/$run/train_log.jsonl" "$dst/"
done
