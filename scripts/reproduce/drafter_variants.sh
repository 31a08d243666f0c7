#!/usr/bin/env bash
# The issue-16 recipe comparison: short drafter runs on the same data (the first 960 corpus records,
# 16 held out; the feature cache of their parts), block 8, gamma 4, dense anchors (stride 4),
# 16k loss vocab, bf16 autocast, 1 thread each (two side by side), then one table and one plot of
# their held-out curves -> results/train-curves/smollm2-drafter-variants/. Resumable like any training run.
# Usage: scripts/reproduce/drafter_variants.sh   (env: RUNS, DCOCO)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
RUNS=${RUNS:-runs/drafter-variants}
common=(--max-records 960 --heldout 16 --block-size 8 --gamma 4 --anchor-stride 4
  --loss-vocab 16000 --autocast --target-dtype bf16 --threads 1 --save-every 1000000
  --warmup-ratio 0.04)
variant() { local name=$1; shift; "$DCOCO" train-drafter --out "$RUNS/$name" "${common[@]}" "$@"; }
variant lr1e-3-b4 --lr 1e-3 --batch-size 4 --max-steps 120 --eval-every 20 &
variant lr3e-3-b1 --lr 3e-3 --batch-size 1 --max-steps 480 --eval-every 80 &
wait
variant warm-lr6e-4-b1 --init-from-target --lr 6e-4 --batch-size 1 --max-steps 160 --eval-every 80 &
variant 1layer-lr3e-3-b1 --num-layers 1 --lr 3e-3 --batch-size 1 --max-steps 480 --eval-every 80 &
wait
cw=(--lr 3e-3 --batch-size 1 --max-steps 480 --eval-every 80)
variant cw8-lr3e-3-b1 "${cw[@]}" --context-window 8 --window-doubling-steps 60 &
variant cw2-lr3e-3-b1 "${cw[@]}" --context-window 2 --window-doubling-steps 50 &
wait
# A second seed of the two that differ only by the curriculum (other init, order and eval anchors).
variant lr3e-3-b1-seed1 "${cw[@]}" --seed 1 &
variant cw8-lr3e-3-b1-seed1 "${cw[@]}" --seed 1 --context-window 8 --window-doubling-steps 60 &
wait
names=(lr1e-3-b4 lr3e-3-b1 warm-lr6e-4-b1 1layer-lr3e-3-b1 cw8-lr3e-3-b1 cw2-lr3e-3-b1
  lr3e-3-b1-seed1 cw8-lr3e-3-b1-seed1)
runs=$(printf "$RUNS/%s," "${names[@]}")
"$DCOCO" train-curves "${runs%,}" --out results/train-curves/smollm2-drafter-variants
