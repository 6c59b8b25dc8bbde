#!/usr/bin/env bash
# One device call: the eight square sizes and the Llama-3-8B projections, each swept into a
# new store with paired cuBLAS baselines (the default for a new store), then their reports.
# Usage on the GPU host, from the repository root: benchmarks/gpu_paired_sweeps.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
sweep() {  # NAME CONFIG TRIALS SECONDS
  local store=results/$1-nvidia-h200.sqlite
  timeout -k 20 "$4" python3 -m cutlass_tune.cli sweep "$2" --trials "$3" --storage "sqlite:///$store" \
    > "$out/$1_sweep.txt" 2>&1
  echo "$1 sweep rc=$?"; tail -3 "$out/$1_sweep.txt"
  cp "$store" "$out/"
  python3 benchmarks/sweep_report.py "sqlite:///$store" > "$out/$1_report.md"; cat "$out/$1_report.md"
}
sweep squares-paired configs/squares_bf16.yaml ${SQUARES_TRIALS:-24} ${SQUARES_SECONDS:-330}
sweep llama3-8b-paired configs/llama3_8b_bf16.yaml ${LLAMA_TRIALS:-16} ${LLAMA_SECONDS:-180}
