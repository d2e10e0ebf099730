#!/usr/bin/env bash
# GPU check + benchmark of the fused DSpark sequential-head kernel (dspark_kernels).
#
# Made for one H200 with no internet: needs python3 with torch + triton only
# (SGLang is used for an extra "upstream" column when it imports, skipped otherwise).
# Wall time: at most CHECK_TIMEOUT + BENCH_TIMEOUT seconds (default 150 + 330 = 8 min).
#
#   benchmarks/run_gpu_bench.sh [extra gpu_kernel_bench.py args for the timing run]
#
# Env: PYTHON (python3), OUT (results folder; default artifacts/gpu_bench),
#      CHECK_TIMEOUT (150), BENCH_TIMEOUT (330).
# Writes check.log/check.json (CUDA-graph capture/replay + correctness sweep) and
# bench.log/bench.json (the ratio table) under the results folder.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT:-artifacts/gpu_bench}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET

if ! "$PYTHON" -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 3)'; then
    echo "run_gpu_bench.sh: needs torch + triton with a CUDA device" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || true

# 1. Correctness + CUDA-graph check. A hang here would be the persistent kernel's
#    spin barrier: the timeout turns it into a visible failure.
timeout -k 10 "${CHECK_TIMEOUT:-150}" "$PYTHON" benchmarks/gpu_kernel_bench.py --check-only \
    --batches 1,16,256 --gammas 7,15 --vocabs 32000,151936 \
    --json "$OUT_DIR/check.json" 2>&1 | tee "$OUT_DIR/check.log"
check_rc=${PIPESTATUS[0]}
if [ "$check_rc" -eq 124 ] || [ "$check_rc" -eq 137 ]; then
    echo "run_gpu_bench.sh: check timed out; timing with SGLANG_DSPARK_SEQ_HEAD_LAUNCH=stepwise" | tee -a "$OUT_DIR/check.log"
    export SGLANG_DSPARK_SEQ_HEAD_LAUNCH=stepwise
fi

# 2. Timing: batch 1,16,64,256 x gamma 4,7,15 x vocab 32k,152k, rank 256.
timeout -k 10 "${BENCH_TIMEOUT:-330}" "$PYTHON" benchmarks/gpu_kernel_bench.py --skip-checks \
    --time-budget 270 --json "$OUT_DIR/bench.json" "$@" 2>&1 | tee "$OUT_DIR/bench.log"
bench_rc=${PIPESTATUS[0]}

echo "run_gpu_bench.sh: check rc=$check_rc bench rc=$bench_rc; results in $OUT_DIR"
[ "$check_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
