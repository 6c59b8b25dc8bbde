#!/usr/bin/env bash
# One device call: `cutlass-tune confirm` on the layouts store (each problem's two leading
# kernel variants; PASSES passes, added to any confirmation already in the store), then a fresh
# sweep of benchmarks/configs/layouts_1024_16bit.yaml (30 configs: five per type and layout).
# Usage on the GPU host, from the repository root: benchmarks/gpu_layouts_confirm.sh OUTDIR [PASSES]
set -uo pipefail
out=${1:?output directory}; passes=${2:-3}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
store=results/layouts-squares-nvidia-h200.sqlite
timeout -k 10 360 python3 -m cutlass_tune.cli confirm --storage "sqlite:///$store" --top 2 --passes "$passes" \
  > "$out/confirm_layouts_squares.txt" 2>&1
echo "confirm rc=$?"; cut -c1-200 "$out/confirm_layouts_squares.txt" | tail -64
cp "$store" "$out/"
benchmarks/gpu_paired_sweeps.sh "$out" layouts-1024:benchmarks/configs/layouts_1024_16bit.yaml:30:190
