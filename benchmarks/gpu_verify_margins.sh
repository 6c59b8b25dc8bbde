#!/usr/bin/env bash
# Verification margins on the GPU host: bench benchmarks/configs/verify_margins.yaml (every output type,
# both fp8 accumulation modes, partial tiles, a long K) and tabulate how far the verified
# kernels and cuBLAS sit from the correctness bounds (benchmarks/verify_margins.py).
# Usage, from the repository root:  benchmarks/gpu_verify_margins.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
python3 -m cutlass_tune.cli bench benchmarks/configs/verify_margins.yaml --jobs 16 -o "$out/verify_margins.jsonl" \
    > "$out/verify_margins_bench.txt" 2>&1
tail -5 "$out/verify_margins_bench.txt"
python3 benchmarks/verify_margins.py "$out/verify_margins.jsonl" | tee "$out/verify_margins.md"
