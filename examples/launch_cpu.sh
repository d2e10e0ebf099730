#!/usr/bin/env bash
# Launch recipe: an SGLang DSPARK server on CPU with the committed trained tiny pair
# (models/tiny-stdlib, what `make demo` serves), in compact ragged-verify mode with no SPS
# table: our worker learns this engine's step-time profile online and picks each step's
# verify budget (README, "Scheduling verify budgets").
#
#   examples/launch_cpu.sh                 # after `make install` (or `make test`)
#   PORT=30001 examples/launch_cpu.sh      # another port
#   PAIR=DIR examples/launch_cpu.sh        # another pair: DIR/target and DIR/draft
#   PYTHON=python3 examples/launch_cpu.sh  # another interpreter (default: the repo's .venv)
#   TABLE=FILE examples/launch_cpu.sh      # also pass an SGLang SPS table measured for the pair
#
# Stop it with Ctrl-C. Check it with: curl http://127.0.0.1:${PORT:-30000}/health
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "launch_cpu.sh: $PY not found: run 'make install' first (or set PYTHON=...)" >&2
  exit 2
fi
PAIR=${PAIR:-models/tiny-stdlib}
for d in "$PAIR/target" "$PAIR/draft"; do
  [ -f "$d/config.json" ] || { echo "launch_cpu.sh: no model in $d (set PAIR=DIR)" >&2; exit 2; }
done
extra=()
if [ -n "${TABLE:-}" ]; then
  extra+=(--speculative-dspark-sps-table-path "$TABLE")
fi
export SGLANG_RAGGED_VERIFY_MODE=${SGLANG_RAGGED_VERIFY_MODE:-compact}
exec "$PY" -m sglang.launch_server \
  --model-path "$PAIR/target" \
  --speculative-algorithm DSPARK \
  --speculative-draft-model-path "$PAIR/draft" \
  --device cpu --max-total-tokens "${MAX_TOTAL_TOKENS:-32768}" \
  --host 127.0.0.1 --port "${PORT:-30000}" ${extra[@]+"${extra[@]}"}
