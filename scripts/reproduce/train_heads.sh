#!/usr/bin/env bash
# The SmolLM2 checkpoints shipped in checkpoints/smollm2-135m-instruct/, reproduced from the shared
# distillation corpus on CPU. Every run resumes after an interruption (rerun this script) and a
# finished run is skipped. Same seed, steps, sequences and anchors for every run after stage 0, so
# dflash / dcoco-joint / the drop-in heads compare at the same training budget.
#
#   stage 0 (train_drafter.sh): the base drafter, 400 steps            -> checkpoints/.../dflash-base
#   stage 1: the base drafter trained on STEPS more steps -> dflash-b16 (the baseline)
#   stage 2: the DCOCO corrector, drop-in over the frozen stage-1 drafter -> dcoco-dropin-b16
#   stage 3: base drafter + DCOCO corrector, joint, STEPS steps            -> dcoco
#   stage 4: the sequential heads, drop-in like stage 2                    -> dspark, domino
#   stage 5: the corrector ablations, drop-in (no pair state, no candidate representation)
#
# The defaults are the shipped budget (60 steps each, 1 thread, ablations on); ship_heads.sh then
# copies the runs into checkpoints/.
#
# Usage: scripts/reproduce/train_heads.sh [BASE_DRAFTER_DIR]
#        (env: STEPS, HEAD_STEPS, EVAL_EVERY, ABLATIONS, RUNS, DCOCO, THREADS)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
RUNS=${RUNS:-runs}
STEPS=${STEPS:-60}
HEAD_STEPS=${HEAD_STEPS:-60}
THREADS=${THREADS:-1}
BASE=${1:-checkpoints/smollm2-135m-instruct/dflash-base}
COMMON=(--batch-size 4 --anchors-per-seq 64 --loss-vocab 16000 --seed 1
        --feature-cache "$RUNS/features" --eval-every ${EVAL_EVERY:-60} --save-every 20 --heldout 32
        --threads "$THREADS")

done_run() { [ -f "$1/provenance.json" ]; }
# A failed run is reported and the next one still starts (they are independent after stage 1).
failed() { echo "FAILED: $1" >&2; FAILURES=$((FAILURES + 1)); }
FAILURES=0

done_run "$RUNS/dflash-cont/drafter" ||
  "$DCOCO" train-drafter --init "$BASE" --out "$RUNS/dflash-cont" --lr 6e-4 \
    --max-steps "$STEPS" "${COMMON[@]}" ||
  failed dflash-cont
DRAFTER="$RUNS/dflash-cont/drafter"
COMMON+=(--max-steps "$HEAD_STEPS")
done_run "$RUNS/dcoco-dropin/dcoco" ||
  "$DCOCO" train-corrector --head dcoco --mode dropin --init "$DRAFTER" \
    --out "$RUNS/dcoco-dropin" --lr 3e-3 "${COMMON[@]}" ||
  failed dcoco-dropin
done_run "$RUNS/dcoco-joint/dcoco" ||
  "$DCOCO" train-corrector --head dcoco --mode joint --init "$BASE" --out "$RUNS/dcoco-joint" \
    --lr 6e-4 "${COMMON[@]}" --max-steps "$STEPS" ||
  failed dcoco-joint
done_run "$RUNS/dspark/dspark" ||
  "$DCOCO" train-corrector --head dspark --mode dropin --init "$DRAFTER" --out "$RUNS/dspark" \
    --lr 3e-3 --rank 64 "${COMMON[@]}" ||
  failed dspark
done_run "$RUNS/domino/domino" ||
  "$DCOCO" train-corrector --head domino --mode dropin --init "$DRAFTER" --out "$RUNS/domino" \
    --lr 3e-3 --mlp-hidden 128 --lambda-warm 0 "${COMMON[@]}" ||
  failed domino
# The ablations (ABLATIONS=0 skips them): two more drop-in runs.
[ "${ABLATIONS:-1}" = 1 ] || { echo "runs done under $RUNS ($FAILURES failed)"; exit "$FAILURES"; }
done_run "$RUNS/dcoco-nopair/dcoco" ||
  "$DCOCO" train-corrector --head dcoco --mode dropin --init "$DRAFTER" \
    --out "$RUNS/dcoco-nopair" --lr 3e-3 --no-use-pair-state "${COMMON[@]}" ||
  failed dcoco-nopair
done_run "$RUNS/dcoco-nocand/dcoco" ||
  "$DCOCO" train-corrector --head dcoco --mode dropin --init "$DRAFTER" \
    --out "$RUNS/dcoco-nocand" --lr 3e-3 --no-use-candidate-repr "${COMMON[@]}" ||
  failed dcoco-nocand
echo "runs done under $RUNS ($FAILURES failed)"
exit "$FAILURES"
