#!/usr/bin/env bash
# The shipped drafter for SmolLM2 -> checkpoints/smollm2-135m-instruct/dflash: copy hints and a copy
# gate, in two stages from stage 3 of train_drafter_b8.sh (`dflash-mask`, block 8, 2 layers; its
# shipped copy, the same file, is the init where the run is gone):
#   1. hints: the mask slots hold prompt lookup's tokens where the context has a match
#      (`train-drafter --copy-hints`, dcoco.models.copy_hints), every part of the corpus, seed 3
#      (anchor offsets its init's stages did not use), gamma 4, lr 6e-4, STEPS steps (default
#      6,000: about 50 min on 2 idle cores);
#   2. gate: from stage 1, a copy gate (`--copy-gate`: a learnt bonus on each slot's hint logit,
#      zero at the start), seed 5 (another order of the corpus), GATE_STEPS steps (default 4,000).
# Resumable: rerun the same command; a finished stage is skipped.
# Usage: scripts/reproduce/train_drafter_copy.sh        train (or continue)
#        scripts/reproduce/train_drafter_copy.sh ship   copy stage 2's latest snapshot and both
#                                                       logs into checkpoints/ and plot the curves
# env: RUN (stage-1 run dir, default under the cache dir; stage 2 is beside it, suffix -gate),
#      INIT, STEPS, GATE_STEPS, THREADS, DCOCO
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
RUNS=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}/runs
RUN=${RUN:-$RUNS/drafter-smollm2-b8-copy}
GATE=$RUN-gate
STAGE3=$RUNS/drafter-smollm2-b8-stage3/continue/snapshot
[[ -d $STAGE3 ]] || STAGE3=checkpoints/smollm2-135m-instruct/dflash-mask
INIT=${INIT:-$STAGE3}
DEST=checkpoints/smollm2-135m-instruct/dflash
COMMON=(--gamma 4 --lr 6e-4 --warmup-ratio 0.02 --eval-every 500 --save-every 200
  --loss-vocab 16000 --autocast --target-dtype bf16 --batch-size 1 --anchor-stride 4
  --heldout 32 --threads "${THREADS:-2}")
if [[ "${1:-}" == ship ]]; then
  mkdir -p "$DEST"
  cp "$GATE"/snapshot/* "$GATE/train_log.jsonl" "$DEST/"
  cp "$RUN/train_log.jsonl" "$DEST/hints_train_log.jsonl"  # where the init came from
  "$DCOCO" train-curves "$RUN,$GATE" --out results/smollm2-drafter-copy
  exit 0
fi
stage_done() {  # its snapshot is its last step's
  .venv/bin/python -c 'import json, sys; p = json.load(open(sys.argv[1]))
sys.exit(p["steps"] != p["total_steps"])' "$1/snapshot/provenance.json" 2>/dev/null
}
if ! stage_done "$RUN"; then
  "$DCOCO" train-drafter --out "$RUN" --init "$INIT" --copy-hints --max-steps "${STEPS:-6000}" \
    --seed 3 "${COMMON[@]}"
fi
"$DCOCO" train-drafter --out "$GATE" --init "$RUN/snapshot" --copy-gate \
  --max-steps "${GATE_STEPS:-4000}" --seed 5 "${COMMON[@]}"
