#!/usr/bin/env bash
# One device call: re-measure cutlass_tune.matmul through the API, then sweep (or resume) the
# eight square sizes. Usage on the GPU host, from the repository root: benchmarks/gpu_squares.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
store=results/squares-nvidia-h200.sqlite
if [ "${SKIP_REPORT:-0}" != 1 ]; then
  benchmarks/gpu_report.sh "$out" > "$out/report.log" 2>&1; tail -8 "$out/report.log"
fi
timeout -k 20 ${SWEEP_SECONDS:-420} python3 -m cutlass_tune.cli sweep configs/squares_bf16.yaml --trials ${TRIALS:-32} \
  --storage "sqlite:///$store" > "$out/squares_sweep.txt" 2>&1
echo "sweep rc=$?"; tail -14 "$out/squares_sweep.txt"
cp "$store" "$out/"
python3 benchmarks/sweep_report.py "sqlite:///$store" | tee "$out/squares_report.md"
