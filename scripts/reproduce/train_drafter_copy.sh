#!/usr/bin/env bash
# The copy-hint drafter for SmolLM2 -> checkpoints/smollm2-135m-instruct/dflash-copy: stage 3 of
# train_drafter_b8.sh (the shipped `dflash`, block 8, 2 layers; its shipped copy, the same file,
# is the INIT where the run is gone), its mask slots filled with prompt lookup's tokens where the
# context has a match (`train-drafter --copy-hints`, dcoco.models.copy_hints), trained on every part
# of the corpus: seed 3 (anchor offsets its init's stages did not use), gamma 4, lr 6e-4, STEPS
# steps (default 6,000: about 55 min on 2 idle cores). Resumable: rerun the same command.
# Usage: scripts/reproduce/train_drafter_copy.sh        train (or continue)
#        scripts/reproduce/train_drafter_copy.sh ship   copy its latest snapshot and log into
#                                                       checkpoints/ and plot its held-out curve
# env: RUN (run dir, default under the cache dir), INIT, STEPS, THREADS, DCOCO
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
RUNS=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}/runs
RUN=${RUN:-$RUNS/drafter-smollm2-b8-copy}
STAGE3=$RUNS/drafter-smollm2-b8-stage3/continue/snapshot
[[ -d $STAGE3 ]] || STAGE3=checkpoints/smollm2-135m-instruct/dflash
INIT=${INIT:-$STAGE3}
DEST=checkpoints/smollm2-135m-instruct/dflash-copy
if [[ "${1:-}" == ship ]]; then
  mkdir -p "$DEST"
  cp "$RUN"/snapshot/* "$RUN/train_log.jsonl" "$DEST/"
  "$DCOCO" train-curves "$RUN" --out results/smollm2-drafter-copy
  exit 0
fi
"$DCOCO" train-drafter --out "$RUN" --init "$INIT" --copy-hints --max-steps "${STEPS:-6000}" \
  --gamma 4 --seed 3 --lr 6e-4 --warmup-ratio 0.02 --eval-every 500 --save-every 200 \
  --loss-vocab 16000 --autocast --target-dtype bf16 --batch-size 1 --anchor-stride 4 \
  --heldout 32 --threads "${THREADS:-2}"
