#!/usr/bin/env bash
# One device call: timer resolution, then the hand-picked candidates of
# benchmarks/configs/candidates_bf16.yaml at 1024^3-8192^3 with paired baselines, then the GPU tests.
# Usage on the GPU host, from the repository root: benchmarks/gpu_candidates.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$out/gpu.txt"
python3 benchmarks/timer_resolution.py 400 > "$out/timer_resolution.txt" 2>&1; cat "$out/timer_resolution.txt"
python3 -m cutlass_tune.cli compile benchmarks/configs/candidates_bf16.yaml --jobs 16 > "$out/candidates_compile.txt" 2>&1
tail -3 "$out/candidates_compile.txt"
timeout -k 10 ${BENCH_SECONDS:-330} python3 -m cutlass_tune.cli bench benchmarks/configs/candidates_bf16.yaml --paired \
  --output "$out/candidates.jsonl" > "$out/candidates_bench.txt" 2>&1
echo "bench rc=$?"; tail -4 "$out/candidates_bench.txt"
python3 benchmarks/summarize_bench.py "$out/candidates.jsonl" > "$out/candidates_summary.md" 2>&1
head -40 "$out/candidates_summary.md"
if [ "${TESTS:-1}" = 1 ]; then
  timeout -k 10 ${TEST_SECONDS:-150} python3 -m pytest tests/bench -m gpu -q -s -p no:cacheprovider \
    > "$out/gpu_tests.log" 2>&1
  echo "tests rc=$?"; grep -E "cuBLAS|paired|passed|failed" "$out/gpu_tests.log" | tail -12
fi
