#!/usr/bin/env bash
# One device call: the kernels cuBLAS picks per problem, then the epilogue subtile and
# C-operand knobs on the bf16 winners (benchmarks/configs/epilogue_knobs_bf16.yaml), two paired passes.
# Usage on the GPU host, from the repository root: benchmarks/gpu_epilogue_knobs.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 90 python3 benchmarks/cublas_kernels.py > "$out/cublas_kernels.md" 2> "$out/cublas_kernels.err"
echo "cublas kernels rc=$?"; cat "$out/cublas_kernels.md"; tail -3 "$out/cublas_kernels.err"
timeout -k 10 420 python3 -m cutlass_tune.cli bench benchmarks/configs/epilogue_knobs_bf16.yaml --repeat 2 \
  --output "$out/epilogue_knobs.jsonl" > "$out/epilogue_knobs_bench.txt" 2>&1
echo "epilogue knobs bench rc=$?"; tail -3 "$out/epilogue_knobs_bench.txt"
python3 benchmarks/repeat_report.py "$out/epilogue_knobs.jsonl" > "$out/epilogue_knobs_report.md"
cat "$out/epilogue_knobs_report.md"
