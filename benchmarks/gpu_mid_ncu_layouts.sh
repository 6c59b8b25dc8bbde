#!/usr/bin/env bash
# One device call: the 1024^3/2048^3 candidates (paired, two passes), an Nsight Compute look at
# the 8192^3 winners and cuBLAS, then the layout sweep and more of the bf16 squares sweep.
# Usage on the GPU host, from the repository root: benchmarks/gpu_mid_ncu_layouts.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 170 python3 -m cutlass_tune.cli bench benchmarks/configs/mid_bf16.yaml --repeat 2 --output "$out/mid.jsonl" \
  > "$out/mid_bench.txt" 2>&1
echo "mid bench rc=$?"; tail -3 "$out/mid_bench.txt"
python3 benchmarks/summarize_bench.py "$out/mid.jsonl" > "$out/mid_summary.md"; grep -E "^cuBLAS|^\| [0-9]" "$out/mid_summary.md" | head -24
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  timeout -k 10 120 "$ncu" --profile-from-start off --clock-control none --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --csv --page details python3 benchmarks/ncu_profile.py > "$out/ncu_8192.csv" 2> "$out/ncu.err"
  echo "ncu rc=$?"; grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy" "$out/ncu_8192.csv" | cut -c1-300 | head -30
else
  echo "no ncu on this host"
fi
benchmarks/gpu_paired_sweeps.sh "$out" layouts-16bit-paired:benchmarks/configs/layouts_16bit.yaml:30:170 \
  squares-paired:configs/squares_bf16.yaml:32:110
