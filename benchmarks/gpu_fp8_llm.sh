#!/usr/bin/env bash
# One device call: fp8 GPU tests and bench, then the Llama-3-8B projection sweep.
# Usage on the GPU host, from the repository root: benchmarks/gpu_fp8_llm.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -s -rA -m gpu -k fp8 tests/bench/test_gpu_fp8.py tests/report/test_matmul.py \
  > "$out/fp8_tests.txt" 2>&1; echo "fp8 tests rc=$?"; tail -12 "$out/fp8_tests.txt"
timeout 150 python3 -m cutlass_tune.cli bench configs/fp8_quick.yaml --repeat 2 -o "$out/bench-fp8-quick.jsonl" \
  > "$out/fp8_bench.txt" 2>&1; echo "fp8 bench rc=$?"; tail -4 "$out/fp8_bench.txt"
store=results/llama3-8b-nvidia-h200.sqlite
timeout -k 20 ${SWEEP_SECONDS:-300} python3 -m cutlass_tune.cli sweep configs/llama3_8b_bf16.yaml --trials ${TRIALS:-32} \
  --storage "sqlite:///$store" > "$out/llama_sweep.txt" 2>&1; echo "sweep rc=$?"
cp "$store" "$out/"
python3 benchmarks/sweep_report.py "sqlite:///$store" | tee "$out/llama_report.md"
