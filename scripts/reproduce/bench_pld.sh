#!/usr/bin/env bash
# Plain vs prompt lookup on SmolLM2 in bf16, batch 1, interleaved, one run (console only).
# Usage: scripts/reproduce/bench_pld.sh [EXTRA COMPARE FLAGS]
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
"$DCOCO" compare --methods plain,pld --dtype bf16 --max-new-tokens 256 "$@"
