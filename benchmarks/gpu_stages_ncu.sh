#!/usr/bin/env bash
# One device call: ping-pong 128x128 over tile K and stages at 2048^3 and 4096^3
# (benchmarks/configs/stages_2048_bf16.yaml, two paired passes), then Nsight Compute over several rounds of
# the 2048^3 kernels and cuBLAS: cycles, clock, L2 and DRAM bytes per launch
# (benchmarks/ncu_profile.py, benchmarks/ncu_cycles.py; board clocks left alone).
# Usage on the GPU host, from the repository root: benchmarks/gpu_stages_ncu.sh OUTDIR [ROUNDS]
set -uo pipefail
out=${1:?output directory}; rounds=${2:-7}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
timeout -k 10 330 python3 -m cutlass_tune.cli bench benchmarks/configs/stages_2048_bf16.yaml --repeat 2 \
  --output "$out/stages_2048.jsonl" > "$out/stages_2048_bench.txt" 2>&1
echo "bench rc=$?"; grep -iE "compiled|failed" "$out/stages_2048_bench.txt" | head -5
python3 benchmarks/repeat_report.py "$out/stages_2048.jsonl" > "$out/stages_2048_report.md"
cat "$out/stages_2048_report.md"
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this host"; exit 0; }
# compile (and run once) outside the profiler, so ncu sees cache hits only
timeout -k 10 150 python3 benchmarks/ncu_profile.py 2048 > "$out/ncu_2048_plain.txt" 2>&1
echo "plain rc=$?"
timeout -k 10 150 "$ncu" --profile-from-start off --clock-control none --csv --page details \
  --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_active.avg,smsp__cycles_elapsed.avg.per_second,lts__t_bytes.sum,dram__bytes.sum \
  python3 benchmarks/ncu_profile.py 2048 "$rounds" > "$out/ncu_2048_rounds.csv" 2> "$out/ncu_2048_rounds.err"
echo "ncu rc=$?"; tail -3 "$out/ncu_2048_rounds.err"
python3 benchmarks/ncu_cycles.py "$out/ncu_2048_rounds.csv" | tee "$out/ncu_2048_rounds.md"
