#!/usr/bin/env bash
# The full soak of issue 31: `dcoco serve` at fp32 for each method, 32 concurrent `dcoco soak`
# clients for 10 minutes (a tenth of streams dropped mid-way, a tenth fuzzed bodies, a third of
# requests sampled), then SIGTERM. Writes results/serve/smollm2-soak-32-<method>/soak.json; the server's
# log goes to $DCOCO_CACHE_DIR/soak/<method>-server.log. Loopback only; needs `make venv-vllm`.
# Usage: scripts/reproduce/soak_serve.sh [METHOD ...]   (default: dcoco@dcoco-joint-12k dflash@dflash,
#        the checkpoints of the committed soaks; results/serve/smollm2-soak-32-<method before @>)
# env: CLIENTS (32), DURATION (600 s), PORT (8766), DCOCO, RUN (the results folder's stem,
#      smollm2-soak-32: a 30-minute soak is RUN=smollm2-soak-32-30min DURATION=1800),
#      SERVE_FLAGS (more `dcoco serve` flags, e.g. "--kv-cache-gib 0.25")
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s venv venv-vllm
DCOCO=${DCOCO:-.venv/bin/dcoco}
PORT=${PORT:-8766}
LOGS=${DCOCO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dcoco}/soak
mkdir -p "$LOGS"
methods=("$@")
[ ${#methods[@]} -gt 0 ] || methods=(dcoco@dcoco-joint-12k dflash@dflash)
for m in "${methods[@]}"; do
  name=${m%%@*}
  out=results/serve/${RUN:-smollm2-soak-32}-$name
  mkdir -p "$out"
  # shellcheck disable=SC2086 # SERVE_FLAGS is a list of flags
  setsid "$DCOCO" serve --method "$m" --dtype fp32 --port "$PORT" --layout all-cores ${SERVE_FLAGS:-} \
    >"$LOGS/$name-server.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 "$server" 2>/dev/null || { echo "dcoco serve died: $LOGS/$name-server.log" >&2; exit 1; }
    sleep 2
  done
  status=0
  "$DCOCO" soak --url "http://127.0.0.1:$PORT" --clients "${CLIENTS:-32}" \
    --duration-s "${DURATION:-600}" --max-requests 1000000 --server-pid "$server" --out "$out" \
    || status=$?
  kill -TERM "$server"
  wait "$server" || true
  [ "$status" -eq 0 ] || { echo "soak of $m failed: $out/soak.json" >&2; exit "$status"; }
done
