#!/usr/bin/env bash
# One device call: Stream-K and cooperative 256x192 candidates at 2048^3-6144^3
# (benchmarks/configs/streamk_mid_bf16.yaml, two paired passes), then `cutlass-tune confirm` on the
# layouts store (each problem's two leading kernel variants, three passes), copied back.
# Usage on the GPU host, from the repository root: benchmarks/gpu_streamk_mid.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
timeout -k 10 320 python3 -m cutlass_tune.cli bench benchmarks/configs/streamk_mid_bf16.yaml --repeat 2 \
  --output "$out/streamk_mid.jsonl" > "$out/streamk_mid_bench.txt" 2>&1
echo "streamk_mid bench rc=$?"; grep -iE "compiled|failed|spill|error" "$out/streamk_mid_bench.txt" | head -8
python3 benchmarks/repeat_report.py "$out/streamk_mid.jsonl" > "$out/streamk_mid_report.md"; cat "$out/streamk_mid_report.md"
store=results/layouts-squares-nvidia-h200.sqlite
timeout -k 10 230 python3 -m cutlass_tune.cli confirm --storage "sqlite:///$store" --top 2 --passes 3 \
  > "$out/confirm_layouts_squares.txt" 2>&1
echo "confirm rc=$?"; cat "$out/confirm_layouts_squares.txt" | cut -c1-200 | tail -40
cp "$store" "$out/"
