#!/usr/bin/env bash
# results/archive/smollm2-coverage: top-k coverage of the shipped drafter (the corrector's headroom).
# Usage: scripts/reproduce/coverage.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv
DCOCO=${DCOCO:-.venv/bin/dcoco}
"$DCOCO" coverage --feature-cache runs/features --out results/archive/smollm2-coverage
