#!/usr/bin/env bash
# One device call for the report stage: compile the tuned kernels of the committed sweep, run
# the GPU tests of tests/report, and measure cutlass_tune.matmul against torch through the API.
# Usage on the GPU host, from the repository root:  benchmarks/gpu_report.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
store=results/sweep-nvidia-h200.sqlite
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache} PYTHONUNBUFFERED=1
python3 - "$store" <<'PY'
import json, sys
from cutlass_tune.compile import compile_kernels
from cutlass_tune.report import load_best
from cutlass_tune.space import KernelConfig
configs = [KernelConfig.from_dict(json.loads(c)) for c in load_best(sys.argv[1])["config"]]
print([(r.config.name, r.status.value) for r in compile_kernels(configs)])
PY
timeout 240 python3 -m pytest tests/report -m gpu -q -rA 2>&1 | tee "$out/report_gpu_tests.log" | tail -12
timeout 200 python3 benchmarks/matmul_api.py "$store" 2>&1 | tee "$out/matmul_api.md"
