#!/usr/bin/env bash
# The corrector's objectives and options over the shipped drafter
# (checkpoints/smollm2-135m-instruct/dflash), from the corrector cache (issue 27):
#   `cache`: the frozen drafter's top-32 candidates, logits and hidden states at every 8th reply
#      position of the corpus, plus `dcoco heldout`'s own 1,771 held-out blocks
#      (`dcoco corrector-cache`; resumable part by part);
#   `variants`: the objectives and options on the same blocks (the first 6 corpus parts) and the
#      same budget (300 steps x 256 blocks), curves in results/train-curves/smollm2-corrector-variants;
#   `heldout`: every shipped drafter method and head on the held-out blocks in fp32
#      (results/smollm2-heldout-heads).
# The shipped heads themselves come from their recipes (recipes/smollm2-135m-instruct/*.toml,
# `dcoco recipe`). The variants' pair-count rows in docs/training.md were measured with counts of
# every training reply (a leak since fixed); rerun, they count on the parts after the first 6.
# Runs live under the cache dir; every run resumes after a kill (rerun the same command).
# Usage: scripts/reproduce/corrector_variants.sh [cache|variants|heldout]
# env: THREADS (per run, default 1), DCOCO
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
CACHE=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}
RUNS=$CACHE/runs/heads-cached
THREADS=${THREADS:-1}
COMMON=(--mode dropin --init dflash --corrector-cache --no-cache-build --target-dtype bf16
  --autocast --lr 1e-3 --gamma 4 --warmup-ratio 0.04 --batch-size 4 --anchor-stride 0 --loss-vocab 0
  --threads "$THREADS")

train() {  # name head steps parts [flags]: one run, skipped once finished
  local name=$1 head=$2 steps=$3 parts=$4
  shift 4
  [ -f "$RUNS/$name/$head/provenance.json" ] && return 0
  "$DCOCO" train-corrector --head "$head" --out "$RUNS/$name" --max-steps "$steps" \
    --cache-parts "$parts" --eval-every 100 --save-every 100 "${COMMON[@]}" "$@"
}

case "${1:-variants}" in
cache)
  "$DCOCO" corrector-cache --drafter dflash --threads "${THREADS}"
  ;;
variants)
  train v-paper dcoco 300 6 --features logit --loss pairs
  train v-cond-all dcoco 300 6 --features normalised --anchor --successor-query --loss conditional
  train v-pairs-all dcoco 300 6 --features normalised --anchor --successor-query --loss pairs
  train v-cond-noanchor dcoco 300 6 --features normalised --successor-query --loss conditional
  train v-pairs-counts dcoco 300 6 --features normalised --anchor --successor-query --loss pairs \
    --count-pairs
  train v-cond-counts dcoco 300 6 --features normalised --anchor --successor-query \
    --loss conditional --count-pairs
  "$DCOCO" train-curves "$(printf "$RUNS/%s," v-paper v-cond-all v-pairs-all v-cond-noanchor \
    v-pairs-counts v-cond-counts | sed 's/,$//')" --num-draft-tokens 7 --out results/train-curves/smollm2-corrector-variants
  ;;
heldout)
  METHODS=dflash@dflash,dcoco@dcoco-counted,dcoco:global@dcoco-counted,dspark@dspark-dropin
  METHODS+=,domino@domino-dropin,dcoco@dcoco-dropin,pld,pld-dflash@dflash,dflash@dflash-mask
  METHODS+=,dcoco@dcoco-dropin-mask
  "$DCOCO" heldout --methods "$METHODS" --num-draft-tokens 3,7 --dtype fp32 --threads 2 \
    --out results/smollm2-heldout-heads
  ;;
*)
  echo "usage: $0 [cache|variants|heldout]" >&2
  exit 2
  ;;
esac
