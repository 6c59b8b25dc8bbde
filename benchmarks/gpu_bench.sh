#!/usr/bin/env bash
# One device call: compile the probe configs, run the GPU tests, then `bench` the quick and
# probe spaces. Usage on the GPU host, from the repository root:  benchmarks/gpu_bench.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
ct() { python3 -m cutlass_tune.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
ct compile configs/probes.yaml 2>&1 | tee "$out/compile.log"
timeout 330 python3 -m pytest tests/bench -m gpu -q -rA 2>&1 | tee "$out/gpu_tests.log" | tail -25
timeout 150 python3 -m cutlass_tune.cli bench configs/quick.yaml --repeat 2 -o "$out/quick.jsonl" > "$out/quick.txt" 2>&1
tail -6 "$out/quick.txt"
timeout 150 python3 -m cutlass_tune.cli bench configs/probes.yaml -o "$out/probes.jsonl" > "$out/probes.txt" 2>&1
tail -4 "$out/probes.txt"
