#!/usr/bin/env bash
# One device call: sourceless candidates at 1024^3/2048^3 (benchmarks/configs/mid_nosrc_bf16.yaml, two
# paired passes), then the bf16 squares sweep resumed with epilogue_source in its space.
# Usage on the GPU host, from the repository root: benchmarks/gpu_nosrc.sh OUTDIR [SWEEP ...]
# (SWEEP as in gpu_paired_sweeps.sh; default: 16 more configs for the bf16 squares store).
set -uo pipefail
out=${1:?output directory}; shift
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 170 python3 -m cutlass_tune.cli bench benchmarks/configs/mid_nosrc_bf16.yaml --repeat 2 \
  --output "$out/mid_nosrc.jsonl" > "$out/mid_nosrc_bench.txt" 2>&1
echo "mid nosrc bench rc=$?"; tail -3 "$out/mid_nosrc_bench.txt"
python3 benchmarks/repeat_report.py "$out/mid_nosrc.jsonl" > "$out/mid_nosrc_report.md"
sed -n '/best kernel by median/,$p' "$out/mid_nosrc_report.md"
[ $# -gt 0 ] || set -- squares-paired:configs/squares_bf16.yaml:49:330
benchmarks/gpu_paired_sweeps.sh "$out" "$@"
