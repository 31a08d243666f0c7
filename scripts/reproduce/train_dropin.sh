#!/usr/bin/env bash
# checkpoints/smollm2-135m-instruct/dcoco-dropin: the DCOCO corrector trained as a drop-in over the
# frozen shipped drafter (checkpoints/.../dflash, from train_drafter_copy.sh), then its held-out τ
# against the drafter alone on the same blocks (OUT, default results/smollm2-dropin-copy).
# DRAFTER=dflash-mask HEAD=dcoco-dropin-mask OUT=results/smollm2-dropin: the same over the MASK
# drafter (train_drafter_b8.sh). Resumable: rerun after a kill.
# Usage: scripts/reproduce/train_dropin.sh   (env: DRAFTER, HEAD, OUT, RUN, STEPS, THREADS, DCOCO)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
CACHE=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}
NAME=${DRAFTER:-dflash}  # the shipped drafter under checkpoints/smollm2-135m-instruct/
HEAD=${HEAD:-dcoco-dropin}
DRAFTER=checkpoints/smollm2-135m-instruct/$NAME
# One run per drafter: a new `dflash` must not find the finished run of the one it replaced.
RUN=${RUN:-$CACHE/runs/dcoco-dropin-$(sha256sum "$DRAFTER/model.safetensors" | cut -c1-12)}
DEST=checkpoints/smollm2-135m-instruct/$HEAD
[ -f "$RUN/dcoco/provenance.json" ] ||
  "$DCOCO" train-corrector --head dcoco --mode dropin --init "$DRAFTER" --out "$RUN" --lr 3e-3 \
    --batch-size 4 --anchors-per-seq 64 --loss-vocab 16000 --seed 1 --target-dtype bf16 \
    --autocast --max-steps "${STEPS:-240}" --eval-every 60 --save-every 20 --heldout 32 \
    --threads "${THREADS:-2}"
mkdir -p "$DEST"
cp "$RUN"/dcoco/* "$RUN/train_log.jsonl" "$DEST/"
METHOD=dflash
[[ $NAME == dflash ]] || METHOD=dflash@$NAME
"$DCOCO" heldout --methods "$METHOD,dcoco@$HEAD" --slots 3,7 --dtype bf16 \
  --threads "${THREADS:-2}" --out "${OUT:-results/smollm2-dropin-copy}"
