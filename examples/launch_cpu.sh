#!/usr/bin/env bash
# Launch recipe: DSPARK on CPU with the tiny local models (built by `make demo`).
# Compact ragged verify + an SPS table => per-step verify budgets below "verify all".
set -euo pipefail
ART=${ART:-artifacts/tiny}
SGLANG_RAGGED_VERIFY_MODE=compact SGLANG_DSPARK_ENABLE_SPS_RECORD=1 \
python -m sglang.launch_server \
  --model-path "$ART/target" \
  --speculative-algorithm DSPARK \
  --speculative-draft-model-path "$ART/draft" \
  --speculative-dspark-sps-table-path profiles/tiny-cpu-2core.sglang-sps-table.json \
  --device cpu --port "${PORT:-30000}"
