#!/usr/bin/env bash
# Timing regimes on one GPU (benchmarks/regimes.md): committed stores' problems confirmed in each
# regime, then the fp8 table checked at the call site in the idle-gap regime, then the GPU tests.
#   moe:   benchmarks/results/session_20261127c/h200_moe_suite: three compute-bound expert GEMMs and
#          one memory-bound decode shape (2,048 rows over 128 experts), top kernel, 2 passes per regime
#   fp8:   benchmarks/results/fp8_h200_20261127/rowwise: two compute-bound row-wise problems
#   check: `check --regime idle-gap:1000us` of the fp8 store's table, recording call-site ratios
#   tests: pytest -m gpu tests/bench/test_gpu_regimes.py
#
#   benchmarks/gpu_regimes.sh OUTDIR [PHASES]   (default "moe fp8 check tests"; state in REGIMES_DIR,
#                                               default /tmp/regimes; each finished step is skipped on a rerun)
# A call stops starting steps when fewer than a step's seconds are left of REGIMES_SECONDS (default 540):
# run it again (same OUTDIR) to go on. Wheels carried in .whl/ are installed when optuna or CUTLASS's
# headers are missing.
set -uo pipefail
out=${1:?output directory}
phases=${2:-moe fp8 check tests}
state=${REGIMES_DIR:-/tmp/regimes}
budget=${REGIMES_SECONDS:-540}
regimes=${REGIMES:-sustained idle-gap:1000us interleaved:64MiB}
mkdir -p "$out" "$state"
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
ct() { python3 -m cutlass_tune.cli "$@"; }
gpu_facts "$out/gpu.txt"

moe_store=benchmarks/results/session_20261127c/h200_moe_suite/moe-suite.sqlite.gz
moe_problems="32768x3072x4096_* 49152x2048x1408_* 65536x5760x2880_* 2048x3072x4096_*"
fp8_store=benchmarks/results/fp8_h200_20261127/rowwise/fp8_suite-nvidia-h200.sqlite.gz
fp8_problems="1024x4096x4096_* 8192x4096x14336_*"

# confirm NAME GZ "PATTERNS" NEEDED_SECONDS: each regime in turn, one step (and marker) per regime
confirm_in_regimes() {
  local name=$1 gz=$2 patterns=$3 need=$4 args=() p regime tag
  [ -e "$state/$name.sqlite" ] || gunzip -c "$gz" > "$state/$name.sqlite"
  for p in $patterns; do args+=(--problem "$p"); done
  for regime in $regimes; do
    tag=${regime//:/_}
    [ -e "$state/$name-$tag.done" ] && continue
    if [ "$(left)" -lt "$need" ]; then echo "$name $regime: $(left) s left, run again to go on"; return 1; fi
    timeout -k 10 $(( $(left) - 5 )) python3 -m cutlass_tune.cli confirm --storage "$state/$name.sqlite" --top 1 \
      --passes 2 --regime "$regime" "${args[@]}" > "$out/confirm-$name-$tag.txt" 2>&1 \
      && touch "$state/$name-$tag.done"
    echo "$name confirm $regime rc=$?"; tail -8 "$out/confirm-$name-$tag.txt" | cut -c1-220
  done
  ct best --storage "$state/$name.sqlite" --format csv -o "$out/$name-best.csv" >/dev/null
  COLUMNS=400 ct best --storage "$state/$name.sqlite" > "$out/$name-best.txt"
  python3 benchmarks/regimes_summary.py "$out/$name-best.csv" "$state/$name.sqlite" "${args[@]}" \
    | tee "$out/$name-regimes.txt"
}

for phase in $phases; do
  case $phase in
  moe) confirm_in_regimes moe "$moe_store" "$moe_problems" 150 ;;
  fp8) confirm_in_regimes fp8 "$fp8_store" "$fp8_problems" 100 ;;
  check)
    if [ ! -e "$state/check.done" ] && [ -e "$out/fp8-best.csv" ] && [ "$(left)" -gt 120 ]; then
      python3 -c "import sys, pandas as pd; t = pd.read_csv(sys.argv[1]); \
t[t.problem.str.match(r'(1024x4096x4096|8192x4096x14336)_')].to_csv(sys.argv[2], index=False)" \
        "$out/fp8-best.csv" "$state/fp8-two.csv"
      timeout -k 10 $(( $(left) - 5 )) python3 -m cutlass_tune.cli check "$state/fp8-two.csv" --budget-ms 1600 \
        --regime idle-gap:1000us -o "$out/check-fp8-idle-gap.jsonl" --table-out "$out/fp8-checked.csv" \
        > "$out/check-fp8-idle-gap.txt" 2>&1
      rc=$?; echo "fp8 check idle-gap rc=$rc (1: an entry flagged)"; tail -8 "$out/check-fp8-idle-gap.txt" | cut -c1-220
      [ $rc -le 1 ] && touch "$state/check.done"
    fi ;;
  tests)
    if [ ! -e "$state/tests.done" ] && [ "$(left)" -gt 120 ]; then
      timeout -k 10 $(( $(left) - 5 )) python3 -m pytest tests/bench/test_gpu_regimes.py -m gpu -q -rA -s \
        -p no:cacheprovider > "$out/gpu_tests.txt" 2>&1 && touch "$state/tests.done"
      echo "gpu tests rc=$?"; grep -E "passed|failed|MHz" "$out/gpu_tests.txt" | tail -14
    fi ;;
  esac
done
