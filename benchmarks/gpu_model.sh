#!/usr/bin/env bash
# A model's own GEMMs, tuned and used (on the GPU host, from the repository root; one device call per phase):
#   benchmarks/gpu_model.sh tests OUT    # the GPU tests of the operator, nn.Linear, patch and shapes
#   benchmarks/gpu_model.sh sweep OUT    # sweep + sustained confirm of the captured space; the bundle as OUT/bundle.tar,
#                                        # and what matmul delivers per entry (cutlass-tune check)
#   benchmarks/gpu_model.sh e2e OUT      # the model before and after patch: eager, torch.compile, CUDA graph
# SPACE (default benchmarks/configs/model_llama33b_bf16.yaml, written here by
# `cutlass-tune shapes benchmarks/models/llama.py:llama_33b -o benchmarks/configs/model_llama33b_bf16.yaml`),
# TRIALS (16), MIN_RATIO (e2e: patch's, default its own 1.0), STORE (OUT/model.sqlite; give a copy of a returned store to resume), BUNDLE (e2e: a
# folder holding bundle.tar from the sweep phase). Packages the GPU host lacks travel as wheels in .whl/.
set -uo pipefail
phase=${1:?tests, sweep or e2e}; out=${2:?output directory}
whl=${WHL:-.whl}
if compgen -G "$whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"/*.whl || exit
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/ct-cache} PYTHONUNBUFFERED=1
ct() { python3 -m cutlass_tune.cli "$@"; }
space=${SPACE:-benchmarks/configs/model_llama33b_bf16.yaml}; store=${STORE:-$out/model.sqlite}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
case $phase in
tests)
  timeout -k 10 500 python3 -m pytest tests/runtime tests/test_capture.py -m gpu -q -rA -p no:cacheprovider 2>&1 \
    | tee "$out/gpu_tests_model.log" | tail -40
  ;;
sweep)
  [ -n "${STORE:-}" ] && [ "$STORE" != "$out/model.sqlite" ] && cp "$STORE" "$out/model.sqlite" && store=$out/model.sqlite
  start=$SECONDS
  timeout -k 10 $((${SWEEP_S:-300} + 60)) python3 -m cutlass_tune.cli sweep "$space" --trials "${TRIALS:-16}" \
    --timeout "${SWEEP_S:-300}" --storage "$store" 2>&1 | tail -6
  echo "sweep wall $((SECONDS - start)) s"
  start=$SECONDS
  timeout -k 10 ${CONFIRM_S:-150} python3 -m cutlass_tune.cli confirm --storage "$store" --top 2 --passes 2 2>&1 | tail -6
  echo "confirm wall $((SECONDS - start)) s"
  ct best --storage "$store" | tee "$out/best_model.txt"
  ct export --storage "$store" -o /tmp/bundle && tar -C /tmp -cf "$out/bundle.tar" bundle && ls -la "$out/bundle.tar"
  timeout -k 10 ${CHECK_S:-90} python3 -m cutlass_tune.cli check /tmp/bundle --budget-ms 800 -o "$out/check.jsonl" 2>&1 | tail -8
  true  # check exits 1 when an entry misses its claim: that is a finding, not a failed phase
  ;;
e2e)
  tar -C /tmp -xf "${BUNDLE:?a folder holding bundle.tar}/bundle.tar"
  timeout -k 10 ${E2E_S:-540} python3 benchmarks/model_e2e.py /tmp/bundle --model "${MODEL:-llama_33b}" \
    --layers "${LAYERS:-2}" ${MIN_RATIO:+--min-ratio $MIN_RATIO} -o "$out/model_e2e.json" 2>&1 | tee "$out/model_e2e.log" | grep -v Warning | tail -40
  ;;
esac
