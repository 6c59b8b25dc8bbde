#!/usr/bin/env bash
# One device call: epilogue schedules and small plain kernels (benchmarks/configs/epilogue_bf16.yaml), two
# paired passes. Usage on the GPU host, from the repository root: benchmarks/gpu_epilogue_schedules.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 330 python3 -m cutlass_tune.cli bench benchmarks/configs/epilogue_bf16.yaml --repeat 2 \
  --output "$out/epilogue.jsonl" > "$out/epilogue_bench.txt" 2>&1
echo "epilogue bench rc=$?"; tail -3 "$out/epilogue_bench.txt"
python3 benchmarks/repeat_report.py "$out/epilogue.jsonl" > "$out/epilogue_report.md"; cat "$out/epilogue_report.md"
