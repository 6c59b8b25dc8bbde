#!/usr/bin/env bash
# One device call: the bf16 winners in three paired passes, the tuned matmul through the API
# on the paired squares table, and the GPU tests.
# Usage on the GPU host, from the repository root: benchmarks/gpu_confirm.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 240 python3 -m cutlass_tune.cli bench benchmarks/configs/winners_bf16.yaml --repeat 3 \
  --output "$out/winners.jsonl" > "$out/winners_bench.txt" 2>&1
echo "winners bench rc=$?"; tail -4 "$out/winners_bench.txt"
timeout -k 10 90 python3 benchmarks/matmul_api.py results/squares-paired-nvidia-h200.sqlite > "$out/matmul_api.md" 2>&1
echo "matmul api rc=$?"; cat "$out/matmul_api.md"
timeout -k 10 300 python3 -m pytest tests/bench tests/runtime/test_matmul.py -m gpu -q -s -p no:cacheprovider \
  > "$out/gpu_tests.log" 2>&1  # the dashboard tests need plotly, which GPU hosts here lack
echo "tests rc=$?"; grep -E "cuBLAS|paired|passed|failed|Error" "$out/gpu_tests.log" | tail -15
