#!/usr/bin/env bash
# One device call: sweeps, each into its own store results/NAME-GPU.sqlite (GPU: the device's
# name in lower case, e.g. nvidia-h200, nvidia-h100-80gb-hbm3) with paired cuBLAS baselines
# (the default for a new store; a re-run resumes), then each store's report.
# Usage on the GPU host, from the repository root:
#   benchmarks/gpu_paired_sweeps.sh OUTDIR [NAME:CONFIG:TRIALS:SECONDS ...]
# Without sweeps named, the bf16 squares and the Llama-3-8B projections, as first run.
set -uo pipefail
out=${1:?output directory}; shift
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
[ $# -gt 0 ] || set -- squares-paired:configs/squares_bf16.yaml:24:330 llama3-8b-paired:benchmarks/configs/llama3_8b_bf16.yaml:16:180
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//')
for spec in "$@"; do
  IFS=: read -r name config trials seconds <<< "$spec"
  store=results/$name-$gpu.sqlite
  timeout -k 20 "$seconds" python3 -m cutlass_tune.cli sweep "$config" --trials "$trials" \
    --storage "sqlite:///$store" >> "$out/${name}_sweep.txt" 2>&1
  echo "$name sweep rc=$? (124: stopped by its time limit, resumable)"; tail -2 "$out/${name}_sweep.txt"
  cp "$store" "$out/"
  python3 benchmarks/sweep_report.py "sqlite:///$store" > "$out/${name}_report.md"; cat "$out/${name}_report.md"
done
