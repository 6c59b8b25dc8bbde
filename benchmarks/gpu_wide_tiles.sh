#!/usr/bin/env bash
# One device call: tile N 160 and 224 once units enable CUTLASS's extended wgmma shapes. The
# skinny qkv candidates (benchmarks/configs/skinny_qkv_bf16.yaml, the same file that measured 0.71 for
# every tile-N-160 kernel before) and the gate+up candidates (benchmarks/configs/wide_tiles_bf16.yaml),
# two paired passes each; then the GPU tests, since every kernel now exports S_mma_n.
# Usage on the GPU host, from the repository root: benchmarks/gpu_wide_tiles.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
for name in skinny_qkv wide_tiles; do
  timeout -k 10 170 python3 -m cutlass_tune.cli bench "benchmarks/configs/${name}_bf16.yaml" --repeat 2 \
    --output "$out/${name}.jsonl" > "$out/${name}_bench.txt" 2>&1
  echo "$name bench rc=$?"; grep -iE "compiled|failed|spill" "$out/${name}_bench.txt" | head -5
  python3 benchmarks/repeat_report.py "$out/${name}.jsonl" > "$out/${name}_report.md"; cat "$out/${name}_report.md"
done
timeout -k 10 240 python3 -m pytest tests/bench tests/runtime/test_matmul.py -m gpu -q -s -p no:cacheprovider \
  > "$out/gpu_tests.log" 2>&1  # the dashboard tests need plotly, which GPU hosts here lack
echo "tests rc=$?"; grep -E "host stall|cuBLAS vs|passed|failed|Error" "$out/gpu_tests.log" | tail -15
