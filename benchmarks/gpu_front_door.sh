#!/usr/bin/env bash
# One device call per phase, from the repository root on the GPU host:
#   benchmarks/gpu_front_door.sh tests OUTDIR    # every GPU-marked test
#   benchmarks/gpu_front_door.sh readme OUTDIR   # the README's commands and Python API, on configs/quick.yaml
# Packages the GPU host lacks may travel as wheels in .whl/ (installed into /tmp/site first).
set -uo pipefail
phase=${1:?tests or readme}; out=${2:?output directory}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/ct-cache} PYTHONUNBUFFERED=1
ct() { python3 -m cutlass_tune.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
case $phase in
tests)
  timeout -k 10 540 python3 -m pytest tests -m gpu -q -rA -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" | tail -40
  ;;
readme)
  store=$out/quick.sqlite
  ct space configs/quick.yaml
  start=$SECONDS
  ct sweep configs/quick.yaml --trials 6 --storage "$store" 2>&1 | tail -8
  echo "sweep wall $((SECONDS - start)) s"
  ct confirm --storage "$store" --top 2 --passes 3 2>&1 | tail -6
  ct best --storage "$store"
  ct export --storage "$store" -o /tmp/bundle && ls /tmp/bundle
  ct dashboard --storage "$store" -o "$out/report.html" && ls -la "$out/report.html"
  python3 - "$store" <<'PY'
import sys, torch, cutlass_tune
for source in (sys.argv[1], "/tmp/bundle"):
    table = cutlass_tune.BestTable.load(source)
    match = table.lookup(4096, 4096, 4096, dtype="bf16", layout="tn")
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")
    y = cutlass_tune.matmul(a, w.t(), table=table)
    ref = a.float() @ w.float().t()
    err = ((y.float() - ref).norm() / ref.norm()).item()
    print(f"{source}: {match.config.name} {match.runtime.name} exact={match.exact} rel_error={err:.2e}")
    assert err < 1e-2
PY
  ;;
esac
