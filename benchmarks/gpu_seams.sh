#!/usr/bin/env bash
# The runtime's dispatcher and epilogue tree on one GPU: do the committed call-site figures still
# come out of the new code? Two committed H200 stores are exported (their best tables' kernels
# compiled in parallel), then called where users call them:
#   grouped: benchmarks/results/session_20261127c/h200_moe_suite (12 expert GEMMs, grouped_mm
#            against torch._grouped_mm, sustained; committed geomean 1.210)
#   fp8:     benchmarks/results/session_20261127c/h200_fp8_final (block-wise matmul against
#            torch._scaled_mm, CUDA graphs and Python loop; committed graph geomean 1.232 at M <= 256)
# and, with TESTS=1, the GPU tests of TEST_PATHS (default tests/runtime tests/bench; pytest -m gpu, xdist).
#
#   benchmarks/gpu_seams.sh OUTDIR        (state in SEAMS_DIR, default /tmp/seams; resumable)
# Wheels carried in .whl/ are installed to /tmp/site when optuna or CUTLASS's headers are missing.
set -uo pipefail
out=${1:?output directory}
state=${SEAMS_DIR:-/tmp/seams}
budget=${SEAMS_SECONDS:-560}
mkdir -p "$out" "$state"
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
ct() { python3 -m cutlass_tune.cli "$@"; }
gpu_facts "$out/gpu.txt"

moe=benchmarks/results/session_20261127c/h200_moe_suite/moe-suite.sqlite.gz
fp8=benchmarks/results/session_20261127c/h200_fp8_final/blockwise-h200.sqlite.gz
for pair in "grouped:$moe" "fp8:$fp8"; do
  name=${pair%%:*}; gz=${pair#*:}
  [ -e "$state/$name.sqlite" ] || gunzip -c "$gz" > "$state/$name.sqlite"
  if [ ! -e "$state/$name-bundle/.done" ]; then
    ct export --storage "$state/$name.sqlite" -o "$state/$name-bundle" > "$out/$name-export.txt" 2>&1 \
      && touch "$state/$name-bundle/.done"
    echo "$name export rc=$?"; tail -2 "$out/$name-export.txt"
  fi
done

if [ ! -e "$state/grouped_call_site.json" ] && [ "$(left)" -gt 150 ]; then
  mkdir -p "$state/grouped"
  timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/grouped_call_site.py "$state/grouped-bundle" "$state/grouped" \
    > "$out/grouped_call_site.txt" 2>&1 && cp "$state/grouped/call_site.json" "$state/grouped_call_site.json"
  echo "grouped call site rc=$?"; tail -15 "$out/grouped_call_site.txt"
fi
[ -e "$state/grouped_call_site.json" ] && cp "$state/grouped_call_site.json" "$out/"
if [ "$(left)" -gt 100 ]; then
  timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/fp8_call_site.py "$state/fp8-bundle" "$state/fp8" \
    > "$out/fp8_call_site.txt" 2>&1
  echo "fp8 call site rc=$?"; tail -20 "$out/fp8_call_site.txt"
  cp "$state/fp8/fp8_call_site.jsonl" "$out/" 2>/dev/null
fi
if [ "${TESTS:-0}" = 1 ] && [ "$(left)" -gt 120 ]; then
  timeout -k 10 $(( $(left) - 10 )) python3 -m pytest -m gpu -n "${JOBS:-8}" -q -p no:cacheprovider \
    ${TEST_PATHS:-tests/runtime tests/bench} > "$out/gpu_tests.txt" 2>&1
  echo "gpu tests rc=$?"; tail -30 "$out/gpu_tests.txt"
fi
