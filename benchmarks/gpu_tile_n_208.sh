#!/usr/bin/env bash
# One device call: tile N 208 against the families that win elsewhere on the LLaMA-33B
# projections (benchmarks/configs/tile_n_208_bf16.yaml), two paired passes.
# Usage on the GPU host, from the repository root: benchmarks/gpu_tile_n_208.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 ${BENCH_SECONDS:-420} python3 -m cutlass_tune.cli bench benchmarks/configs/tile_n_208_bf16.yaml --repeat 2 \
  --output "$out/tile_n_208.jsonl" > "$out/tile_n_208_bench.txt" 2>&1
echo "bench rc=$?"; grep -iE "compiled|failed" "$out/tile_n_208_bench.txt" | head -5
python3 benchmarks/repeat_report.py "$out/tile_n_208.jsonl" > "$out/tile_n_208_report.md"; cat "$out/tile_n_208_report.md"
