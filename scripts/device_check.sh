#!/usr/bin/env bash
# The prepared GPU check (scripts/device_check.py says what it checks): one summary line per
# check, within 8 minutes on one H100 with no network. `--cpu`: the same checks on the CPU.
# It runs on the machine's own PyTorch and transformers, from the checkout (no install).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3)}
[ -x .venv/bin/python ] && [ "${1:-}" = "--cpu" ] && PYTHON=.venv/bin/python
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec timeout "${DEVICE_CHECK_TIMEOUT:-480}" "$PYTHON" scripts/device_check.py "$@"
