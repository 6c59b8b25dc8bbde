#!/usr/bin/env bash
# The timing methods and the call-site check on one GPU, from the repository root on the GPU host:
#   benchmarks/gpu_sustained.sh "tests bench check" OUTDIR
#     tests: GPU tests of the sustained method and matmul; NVML's energy counter cadence
#     bench: each timing method's ratio per entry of the suite table, twice (methods.jsonl)
#     check: claimed vs delivered through matmul (.before/, when present: the old call path too)
#     confirm: confirm --method sustained on copies of two LLM stores, then check their best tables
set -uo pipefail
phases=${1:?phases}; out=${2:?output directory}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site
fi
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/ct-cache} PYTHONUNBUFFERED=1
site=${PYTHONPATH:-}
export PYTHONPATH=$PWD${site:+:$site}
table=benchmarks/data/suite-nvidia-h200.csv
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$out/gpu.txt"
for phase in $phases; do
  case $phase in
  tests)
    timeout -k 10 300 python3 -m pytest tests/bench/test_gpu_sustained.py tests/runtime -m gpu -q -rA -s \
      -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" | tail -30
    python3 benchmarks/nvml_cadence.py | tee "$out/nvml_cadence.txt" ;;
  bench)
    timeout -k 10 330 python3 benchmarks/methods.py bench $table "$out" --runs 2 2>&1 | tee "$out/bench.log" | tail -5 ;;
  check)
    [ -d .before ] && PYTHONPATH=$PWD/.before${site:+:$site} timeout -k 10 200 python3 benchmarks/methods.py check \
      $table "$out" --tag before 2>&1 | tail -20
    timeout -k 10 200 python3 benchmarks/methods.py check $table "$out" --tag after 2>&1 | tail -20 ;;
  confirm)
    for name in llama33b-nvidia-h200 llama3-70b-tp8-paired-nvidia-h200; do
      cp results/$name.sqlite "$out/$name.sqlite"
      timeout -k 10 280 python3 -m cutlass_tune.cli confirm --storage "$out/$name.sqlite" --top 2 --passes 2 2>&1 | tail -4
      python3 -m cutlass_tune.cli best --storage "$out/$name.sqlite" | cut -c1-150
      python3 -m cutlass_tune.cli best --storage "$out/$name.sqlite" --format csv -o "/tmp/$name.csv"
      timeout -k 10 120 python3 -m cutlass_tune.cli check "/tmp/$name.csv" --budget-ms 1600 -o "$out/check-$name.jsonl" \
        2>&1 | tail -12
    done ;;
  esac
done
