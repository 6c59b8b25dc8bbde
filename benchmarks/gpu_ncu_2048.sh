#!/usr/bin/env bash
# One device call: what the C operand costs tile N 208 (benchmarks/configs/tile_n_208_source_bf16.yaml,
# two paired passes), then Nsight Compute on the 2048^3 kernels and cuBLAS
# (benchmarks/ncu_profile.py 2048; board clocks left alone).
# Usage on the GPU host, from the repository root: benchmarks/gpu_ncu_2048.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 300 python3 -m cutlass_tune.cli bench benchmarks/configs/tile_n_208_source_bf16.yaml --repeat 2 \
  --output "$out/tile_n_208_source.jsonl" > "$out/tile_n_208_source_bench.txt" 2>&1
echo "bench rc=$?"; grep -iE "compiled|failed" "$out/tile_n_208_source_bench.txt" | head -5
python3 benchmarks/repeat_report.py "$out/tile_n_208_source.jsonl" > "$out/tile_n_208_source_report.md"
cat "$out/tile_n_208_source_report.md"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this host"; exit 0; }
# compile (and run once) outside the profiler, so ncu sees cache hits only
timeout -k 10 200 python3 benchmarks/ncu_profile.py 2048 > "$out/ncu_2048_plain.txt" 2>&1
echo "plain rc=$?"; tail -4 "$out/ncu_2048_plain.txt"
timeout -k 10 150 "$ncu" --profile-from-start off --clock-control none --section SpeedOfLight \
  --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max \
  --csv --page details python3 benchmarks/ncu_profile.py 2048 > "$out/ncu_2048.csv" 2> "$out/ncu_2048.err"
echo "ncu rc=$?"; tail -3 "$out/ncu_2048.err"
grep -E '"(Duration|SM Frequency|Elapsed Cycles|Compute \(SM\) Throughput|DRAM Throughput|Grid Size|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|sm__cycles_active.(min|max|avg)|sm__cycles_elapsed.max)"' \
  "$out/ncu_2048.csv" | awk -F'","' '{print $1" | "$(NF-2)" | "$(NF-1)" | "$NF}' | cut -c1-200 | head -60
"$ncu" --query-metrics --chip gh100 2>/dev/null | grep -iE "gmma|pipe_tensor" > "$out/ncu_tensor_metrics.txt"
wc -l "$out/ncu_tensor_metrics.txt"; head -20 "$out/ncu_tensor_metrics.txt"
