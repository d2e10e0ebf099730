#!/usr/bin/env bash
# Everything of sglang-dspark that runs on a GPU machine with torch + Triton and no SGLang,
# in under 8 minutes, ending with one summary table:
#   1. check  (<= CHECK_TIMEOUT s): CUDA-graph capture/replay of the sequential head
#      (Triton persistent + stepwise, torch backend; greedy + sampling), the capture's
#      non-blocking device copy, and a correctness sweep against the torch reference;
#   2. timing (<= BENCH_TIMEOUT s): the fused kernel vs the per-position launch pattern
#      (and SGLang's own code when sglang imports), CUDA-graph replay timings;
#   3. policy (<= POLICY_TIMEOUT s): the budget policy's host cost per step, R = 1..256;
#   4. the summary table of all three (gpu_bench_host.py summary).
#
#   benchmarks/run_gpu_bench.sh [--cpu-smoke] [extra gpu_kernel_bench.py args for the timing run]
#
# --cpu-smoke: the same four steps on CPU in tiny sizes (Triton interpreter, timings
# meaningless); tests/kernels/test_kernels_api.py runs it.
# Env: PYTHON (python3), OUT (results folder; default artifacts/gpu_bench),
#      CHECK_TIMEOUT (130), BENCH_TIMEOUT (250), POLICY_TIMEOUT (60): at most 440 s of
#      phases plus start-up.
# Writes check.{log,json}, bench.{log,json}, policy.{log,json} and summary.txt under OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT:-artifacts/gpu_bench}
mkdir -p "$OUT_DIR"
# kernels/ (dspark_kernels), the root (sglang_dspark.settings / .capture: pure Python) and
# controller/ (dspark_controller): none of them needs SGLang.
export PYTHONPATH="$PWD/kernels:$PWD:$PWD/controller${PYTHONPATH:+:$PYTHONPATH}"
started=$(date +%s)

if [ "${1:-}" = "--cpu-smoke" ]; then
    shift
    export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
    CHECK_ARGS=(--smoke --no-upstream --batches 2 --gammas 2 --vocabs 40)
    BENCH_ARGS=(--smoke --no-upstream --skip-checks --batches 1 --gammas 2 --vocabs 40 --iters 1)
    POLICY_ARGS=(--smoke)
else
    unset TRITON_INTERPRET
    if ! "$PYTHON" -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 3)'; then
        echo "run_gpu_bench.sh: needs torch + triton with a CUDA device (or --cpu-smoke)" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || true
    CHECK_ARGS=(--batches 1,16,256 --gammas 7,15 --vocabs 32000,151936)
    BENCH_ARGS=(--skip-checks --time-budget 200)
    POLICY_ARGS=()
fi

# 1. Correctness + CUDA-graph checks. A hang here would be the persistent kernel's spin
#    barrier: the timeout turns it into a visible failure and the timing run goes stepwise.
timeout -k 10 "${CHECK_TIMEOUT:-130}" "$PYTHON" benchmarks/gpu_kernel_bench.py --check-only \
    "${CHECK_ARGS[@]}" --json "$OUT_DIR/check.json" 2>&1 | tee "$OUT_DIR/check.log"
check_rc=${PIPESTATUS[0]}
if [ "$check_rc" -eq 124 ] || [ "$check_rc" -eq 137 ]; then
    echo "run_gpu_bench.sh: check timed out; timing with SGLANG_DSPARK_SEQ_HEAD_LAUNCH=stepwise" | tee -a "$OUT_DIR/check.log"
    export SGLANG_DSPARK_SEQ_HEAD_LAUNCH=stepwise
fi

# 2. Timing: batch 1,16,64,256 x gamma 4,7,15 x vocab 32k,152k, rank 256 (until the budget).
timeout -k 10 "${BENCH_TIMEOUT:-250}" "$PYTHON" benchmarks/gpu_kernel_bench.py \
    "${BENCH_ARGS[@]}" --json "$OUT_DIR/bench.json" "$@" 2>&1 | tee "$OUT_DIR/bench.log"
bench_rc=${PIPESTATUS[0]}

# 3. The budget policy's host cost per decode step (numpy only).
timeout -k 10 "${POLICY_TIMEOUT:-60}" "$PYTHON" benchmarks/gpu_bench_host.py policy \
    ${POLICY_ARGS[@]+"${POLICY_ARGS[@]}"} --json "$OUT_DIR/policy.json" 2>&1 | tee "$OUT_DIR/policy.log"
policy_rc=${PIPESTATUS[0]}

# 4. One table.
"$PYTHON" benchmarks/gpu_bench_host.py summary "$OUT_DIR/check.json" "$OUT_DIR/bench.json" \
    "$OUT_DIR/policy.json" 2>&1 | tee "$OUT_DIR/summary.txt"
summary_rc=${PIPESTATUS[0]}

echo "run_gpu_bench.sh: check rc=$check_rc bench rc=$bench_rc policy rc=$policy_rc" \
     "summary rc=$summary_rc; $(( $(date +%s) - started )) s; results in $OUT_DIR" | tee -a "$OUT_DIR/summary.txt"
[ "$check_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$policy_rc" -eq 0 ] && [ "$summary_rc" -eq 0 ]
