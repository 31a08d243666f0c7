#!/usr/bin/env bash
# Stage 0 of the SmolLM2 checkpoints -> checkpoints/smollm2-135m-instruct/dflash-base: the base
# drafter from the shared corpus (~55 min on 2 CPU cores; resumable: rerun after an
# interruption), copied into checkpoints/ with its training log. train_heads.sh is stages 1-5.
# Usage: scripts/reproduce/train_drafter.sh   (env: RUN, DCOCO)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
RUN=${RUN:-runs/drafter-smollm2}
DEST=checkpoints/smollm2-135m-instruct/dflash-base
"$DCOCO" train-drafter --out "$RUN" --max-steps 400 --batch-size 4 --anchors-per-seq 32 \
  --lr 1e-3 --threads 2 --eval-every 100 --save-every 25 --heldout 32
mkdir -p "$DEST"
cp "$RUN"/drafter/* "$RUN/train_log.jsonl" "$DEST/"
