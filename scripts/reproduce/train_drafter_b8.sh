#!/usr/bin/env bash
# The issue-16 drafter for SmolLM2 -> checkpoints/smollm2-135m-instruct/dflash-b8: block 8 (up to 7
# drafts; the CPU cycles draft 3-4), gamma 4, dense anchors (every 4th reply position, shifted each
# epoch), the 16k most frequent reply tokens in the loss, bf16 autocast, lr 3e-3 with one sequence
# a step, a context-window curriculum (8 positions, doubling every 2000 steps, the whole context
# from step 14000 on): the best of the measured variants (results/smollm2-drafter-variants);
# 8 epochs over every part of the shared corpus. The first run builds the feature cache (about
# 70 min on 2 idle cores for 4M tokens; later parts are added as the corpus grows). Training takes
# many sessions: it is resumable, so rerun the same command to continue; the run lives under the
# cache dir, which outlives the checkout.
# Usage: scripts/reproduce/train_drafter_b8.sh        train (or continue)
#        scripts/reproduce/train_drafter_b8.sh ship   copy the latest snapshot and the log into
#                                                     checkpoints/ (end of a working session)
# env: RUN (run dir), THREADS, DCOCO
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
CACHE=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}
RUN=${RUN:-$CACHE/runs/drafter-smollm2-b8}
DEST=checkpoints/smollm2-135m-instruct/dflash-b8
if [[ "${1:-}" == ship ]]; then
  mkdir -p "$DEST"
  cp "$RUN"/snapshot/* "$RUN/train_log.jsonl" "$DEST/"
  "$DCOCO" train-curves "$RUN" --out results/smollm2-drafter-b8
  exit 0
fi
"$DCOCO" train-drafter --out "$RUN" --block-size 8 --gamma 4 --anchor-stride 4 \
  --loss-vocab 16000 --autocast --target-dtype bf16 --lr 3e-3 --batch-size 1 --epochs 8 \
  --context-window 8 --window-doubling-steps 2000 \
  --heldout 32 --eval-every 1000 --save-every 200 --threads "${THREADS:-2}"
