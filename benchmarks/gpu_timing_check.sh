#!/usr/bin/env bash
# One device call: the timing checks after the host-gap guard changed (A/A pairs, host stalls),
# then the sourceless winners at 1024^3-2048^3 in three paired passes.
# Usage on the GPU host, from the repository root: benchmarks/gpu_timing_check.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 120 python3 -m pytest tests/bench/test_gpu.py -m gpu -q -s -p no:cacheprovider \
  -k "paired_with_itself or host_time" > "$out/timing_tests.log" 2>&1
echo "timing tests rc=$?"; grep -E "host stall|cuBLAS vs|passed|failed" "$out/timing_tests.log"
sed 's/^  - {m: [4-8].*$//' benchmarks/configs/winners_nosrc_bf16.yaml > /tmp/winners_small.yaml
timeout -k 10 150 python3 -m cutlass_tune.cli bench /tmp/winners_small.yaml --repeat 3 \
  --output "$out/winners_small.jsonl" > "$out/winners_small_bench.txt" 2>&1
echo "winners bench rc=$?"; tail -3 "$out/winners_small_bench.txt"
python3 benchmarks/repeat_report.py "$out/winners_small.jsonl" > "$out/winners_small_report.md"
sed -n '/best kernel by median/,$p' "$out/winners_small_report.md"
