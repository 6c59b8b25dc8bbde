#!/usr/bin/env bash
# One device call: the best 2048^3 kernels (benchmarks/configs/top_2048_bf16.yaml) timed L2-cold between
# events and as L2-warm CUDA-graph replays, each paired with cuBLAS, three passes each.
# Usage on the GPU host, from the repository root: benchmarks/gpu_methods_2048.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
for method in events graph; do
  flag=$([ $method = graph ] && echo --graph)
  timeout -k 10 200 python3 -m cutlass_tune.cli bench benchmarks/configs/top_2048_bf16.yaml --repeat 3 $flag \
    --output "$out/top_2048_$method.jsonl" > "$out/top_2048_${method}_bench.txt" 2>&1
  echo "$method bench rc=$?"
  python3 benchmarks/repeat_report.py "$out/top_2048_$method.jsonl" > "$out/top_2048_${method}_report.md"
  cat "$out/top_2048_${method}_report.md"
done
