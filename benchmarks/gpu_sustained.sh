#!/usr/bin/env bash
# The timing methods and the call-site check on one GPU, from the repository root on the GPU host:
#   benchmarks/gpu_sustained.sh bench OUTDIR   # GPU tests of the sustained method; each method's ratio, twice
#   benchmarks/gpu_sustained.sh check OUTDIR   # claimed vs delivered through matmul (.before/: the old call path)
set -uo pipefail
phase=${1:?bench or check}; out=${2:?output directory}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site
fi
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/ct-cache} PYTHONUNBUFFERED=1
site=${PYTHONPATH:-}
table=benchmarks/data/suite-nvidia-h200.csv
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$out/gpu.txt"
case $phase in
bench)
  export PYTHONPATH=$PWD${site:+:$site}
  timeout -k 10 200 python3 -m pytest tests/bench/test_gpu_sustained.py tests/runtime -m gpu -q -rA -s \
    -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" | tail -30
  timeout -k 10 330 python3 benchmarks/methods.py bench $table "$out" --runs 2 2>&1 | tee "$out/bench.log" | tail -5
  ;;
check)
  [ -d .before ] && PYTHONPATH=$PWD/.before${site:+:$site} timeout -k 10 200 python3 benchmarks/methods.py check \
    $table "$out" --tag before 2>&1 | tail -20
  export PYTHONPATH=$PWD${site:+:$site}
  timeout -k 10 200 python3 benchmarks/methods.py check $table "$out" --tag after 2>&1 | tail -20
  timeout -k 10 120 python3 -m cutlass_tune.cli check $table --budget-ms 600 -o "$out/cli-check.jsonl" 2>&1 | tail -25
  ;;
esac
