#!/usr/bin/env bash
# DCOCO trained jointly with the drafter (issue 27, the paper's main recipe): from the shipped
# drafter (checkpoints/smollm2-135m-instruct/dflash), the corrector with every option of the best
# drop-in (normalised features, slot 1 from the anchor, the successor term, pair counts) and the
# drafter train together on the first PARTS corpus parts; the pair counts come from the parts
# after them. The drafter keeps its own recipe (gamma 4, 16,000-token loss shortlist, one
# sequence a step, dense anchors every 4th position) at a lower peak rate than its last stage, the
# corrector learns at the drop-in's rate. Needs the feature cache (built on the first run, about
# 25 min on 2 cores). Resumable: rerun the same command.
# Usage: scripts/reproduce/train_joint.sh          train (or continue)
#        scripts/reproduce/train_joint.sh ship     copy the result into checkpoints/ as dcoco-joint
# env: RUN (default under the cache dir), STEPS (6000), PARTS (24), LR (2e-4), HEAD_LR (1e-3),
#      HEAD_WEIGHT (0.5: the corrector loss relative to the drafter's),
#      THREADS (2), DCOCO
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
RUN=${RUN:-${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}/runs/dcoco-joint}
DEST=checkpoints/smollm2-135m-instruct/dcoco-joint
if [[ "${1:-}" == ship ]]; then
  mkdir -p "$DEST"
  cp "$RUN"/dcoco/* "$RUN/train_log.jsonl" "$DEST/"
  exit 0
fi
"$DCOCO" train-corrector --mode joint --init checkpoints/smollm2-135m-instruct/dflash \
  --head dcoco --features normalised --anchor --successor-query --loss pairs --count-pairs \
  --cache-parts "${PARTS:-24}" --out "$RUN" --max-steps "${STEPS:-6000}" --seed 7 \
  --lr "${LR:-2e-4}" --head-lr "${HEAD_LR:-1e-3}" --warmup-ratio 0.02 --gamma 4 \
  --loss-vocab 16000 --autocast --target-dtype bf16 --batch-size 1 --anchor-stride 4 \
  --head-loss-weight "${HEAD_WEIGHT:-0.5}" --heldout 32 --eval-every 1000 --save-every 200 \
  --threads "${THREADS:-2}"
