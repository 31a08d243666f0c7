#!/usr/bin/env bash
# The MASK drafter for SmolLM2 -> checkpoints/smollm2-135m-instruct/dflash-mask, in three stages:
#   1. 1344 records of the shared corpus, 8 epochs (10,344 steps, 1.5 h on one core): block 8
#      (up to 7 drafts; the CPU cycles draft 3-4), gamma 4, dense anchors (every 4th reply
#      position, shifted each epoch), the 16k most frequent reply tokens in the loss, bf16
#      autocast, lr 3e-3 with one sequence a step, a context-window curriculum (8 positions,
#      doubling every 250 steps): the best of the measured variants
#      (results/smollm2-drafter-variants);
#   2. from stage 1, every part of the corpus present (it grows), full context, lr 1e-3,
#      STAGE2_STEPS steps (default 16,000, 1.2 epochs of 13.6k records: 75 min on 2 idle cores);
#   3. from stage 2, a second cosine cycle on the anchor offsets stage 2 did not use (seed 2, lr
#      6e-4, 9,000 steps, one thread): the `continue` run of scripts/reproduce/drafter_grow.sh,
#      which beat growing to 4 layers on the same wall-clock (results/smollm2-drafter-grow).
# Stage 3 is the init of the shipped `dflash`, the copy-hint drafter
# (scripts/reproduce/train_drafter_copy.sh).
# The first run builds the feature cache (about 70 min on 2 idle cores for 4M tokens; parts added
# later are cached on their own). Every stage resumes after a kill: rerun the same command. Runs
# live under the cache dir, which outlives the checkout.
# Usage: scripts/reproduce/train_drafter_b8.sh        train (or continue)
#        scripts/reproduce/train_drafter_b8.sh ship   copy stage 3's latest snapshot and the three
#                                                     logs into checkpoints/ (end of a working
#                                                     session) and plot the held-out curves
# env: RUN (stage-2 run dir; stage 1 is beside it, suffix -1344-cw, stage 3 under -stage3/),
#      THREADS, STAGE2_STEPS, DCOCO
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
CACHE=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}
RUN=${RUN:-$CACHE/runs/drafter-smollm2-b8-full}
STAGE1=${RUN%-full}-1344-cw
STAGE3=${RUN%-full}-stage3/continue  # drafter_grow.sh's RUNS default, its `continue` run
DEST=checkpoints/smollm2-135m-instruct/dflash-mask
COMMON=(--loss-vocab 16000 --autocast --target-dtype bf16 --batch-size 1 --anchor-stride 4
  --heldout 32 --threads "${THREADS:-2}")
if [[ "${1:-}" == ship ]]; then
  mkdir -p "$DEST"
  cp "$STAGE3"/snapshot/* "$STAGE3/train_log.jsonl" "$DEST/"
  cp "$RUN/train_log.jsonl" "$DEST/stage2_train_log.jsonl"  # where the inits came from
  cp "$STAGE1/train_log.jsonl" "$DEST/stage1_train_log.jsonl"
  "$DCOCO" train-curves "$STAGE1,$RUN,$STAGE3" --out results/smollm2-drafter-b8
  exit 0
fi
stage_done() {  # its snapshot is its last step's (a snapshot restored without ckpt/ counts too)
  .venv/bin/python -c 'import json, sys; p = json.load(open(sys.argv[1]))
sys.exit(p["steps"] != p["total_steps"])' "$1/snapshot/provenance.json" 2>/dev/null
}
if ! stage_done "$STAGE3"; then  # each stage is the next one's init: a finished one is skipped
  if ! stage_done "$RUN"; then
    if ! stage_done "$STAGE1"; then
      "$DCOCO" train-drafter --out "$STAGE1" --block-size 8 --gamma 4 --max-records 1344 \
        --epochs 8 --lr 3e-3 --context-window 8 --window-doubling-steps 250 --eval-every 250 \
        --save-every 250 "${COMMON[@]}"
    fi
    "$DCOCO" train-drafter --out "$RUN" --init "$STAGE1/snapshot" \
      --max-steps "${STAGE2_STEPS:-16000}" --lr 1e-3 --warmup-ratio 0.02 --eval-every 1000 \
      --save-every 200 "${COMMON[@]}"
  fi
  INIT="$RUN/snapshot" RUNS="${STAGE3%/continue}" VARIANTS=continue THREADS="${THREADS:-2}" \
    scripts/reproduce/drafter_grow.sh
fi
