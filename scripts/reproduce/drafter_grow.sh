#!/usr/bin/env bash
# The issue-16 capacity test: from the stage-2 drafter of the dflash-mask recipe (block 8, 2 layers,
# trained to a plateau where train and held-out acceptance agree), one more stage on every part of
# the corpus, two variants side by side with one thread each (the same wall-clock and cores):
#   continue  the same 2 layers, a second cosine cycle;
#   grow2     2 layers appended (dcoco.train.grow: zeroed residual writes, so it starts exactly as
#             stage 2), fewer steps, as a 4-layer step costs more;
# then one table and one plot of their held-out curves -> results/smollm2-drafter-grow/.
# Resumable like any training run: rerun the same command.
# Usage: scripts/reproduce/drafter_grow.sh   (VARIANTS=grow2: that run alone, no table;
#        `continue` is stage 3 of the dflash-mask recipe)
# env: INIT (default: the dflash-mask recipe's stage 2 under the cache dir), RUNS, VARIANTS, CONTINUE_STEPS,
#      GROW_STEPS, LR, THREADS (per run; default 1), DCOCO
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
CACHE=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}
INIT=${INIT:-$CACHE/runs/dflash-mask/stage2/drafter}
RUNS=${RUNS:-$CACHE/runs/drafter-smollm2-b8-stage3}
common=(--init "$INIT" --gamma 7 --loss-vocab 16000 --autocast --target-dtype bf16 --batch-size 1
  --anchor-stride 4 --heldout 32 --threads "${THREADS:-1}" --lr "${LR:-6e-4}" --warmup-ratio 0.02
  --eval-every 500 --save-every 200 --seed 2)  # seed 2: the anchor offsets stage 2 (seed 0,
# 1.2 epochs at stride 4: offsets 0 and 1) did not use, and another batch order
variant() { local name=$1; shift; "$DCOCO" train-drafter --out "$RUNS/$name" "${common[@]}" "$@"; }
pids=()
for name in ${VARIANTS:-continue grow2}; do
  case $name in
    continue) variant continue --max-steps "${CONTINUE_STEPS:-9000}" & ;;
    grow2) variant grow2 --add-layers 2 --max-steps "${GROW_STEPS:-5000}" & ;;
    *) echo "unknown variant $name" >&2; exit 2 ;;
  esac
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed run stops the script (set -e)
[[ -n "${VARIANTS:-}" ]] || "$DCOCO" train-curves "$RUNS/continue,$RUNS/grow2" \
  --out results/smollm2-drafter-grow
