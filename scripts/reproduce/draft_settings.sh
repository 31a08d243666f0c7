#!/usr/bin/env bash
# τ of the drafter under each --draft-dtype / --draft-block setting, at fixed draft lengths: GSM8K,
# HumanEval and MT-Bench, 6 prompts each, T = 0, 128 new tokens, one `dcoco bench` run per
# setting and length. At T = 0 with a fixed length the drafts, and so τ, do not depend on timing:
# the runs compare by τ (their tokens/s are from separate runs and do not compare).
#
# Usage: scripts/reproduce/draft_settings.sh [OUT]   (default: results/smollm2-draft-settings)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-results/smollm2-draft-settings}}
METHOD=${METHOD:-dflash}
for k in 4 7; do
  for setting in "target full" "target drafted" "int4 full" "int4 drafted"; do
    set -- $setting
    .venv/bin/dcoco bench --suites gsm8k,humaneval,mtbench --limit 6 --max-new-tokens 128 \
      --methods "$METHOD" --num-draft-tokens "$k" --draft-dtype "$1" --draft-block "$2" \
      --results-dir "$OUT" --run-name "k$k-$1-$2" --no-plots > /dev/null 2>&1
    printf 'k=%s --draft-dtype %s --draft-block %s: ' "$k" "$1" "$2"
    grep "^| $METHOD " "$OUT/k$k-$1-$2/report.md" | head -1
  done
done
