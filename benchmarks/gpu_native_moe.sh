#!/usr/bin/env bash
# One call on one GPU for the native operators and the MoE layer (benchmarks/moe_layer.md,
# benchmarks/host_path.md): the native library built and the committed MoE, dense and fp8 stores
# exported side by side; the GPU tests of TEST_PATHS; the model forward of FAMILIES (MODEL=1 steps of
# gpu_moe_layer.sh); host time per call, native on and off. Results under OUTDIR.
#
#   benchmarks/gpu_native_moe.sh OUTDIR      (BUDGET seconds, default 540)
#
# Optional: TEST_PATHS (GPU tests to run), FAMILIES and SPECS (the model runs: "TOKENS TAG FLAGS..."
# entries separated by ';'), LAYER_SPECS (benchmarks/moe_layer.py runs: "FAMILY TOKENS MODE" entries
# separated by ';', each with --profile), HOST=0 (no host table), PRE (a command run after the setup),
# MODEL_RUNS ("FAMILY TOKENS FLAGS..." entries separated by ';', in place of FAMILIES x SPECS), FP8=1 (the
# fp8 row-wise entries at M 16-64 at the call site: benchmarks/fp8_call_site.py), MOE_EXTRA (stores whose best
# rows join the MoE bundle: export_cut's CUT_EXTRA; default the committed tt and weight-gradient stores),
# MODEL_TABLE (a table or store the model runs use in place of the MoE bundle, exported first), MOE_PATTERN
# (the MoE store's problems exported), MOE_CONFIRM_EXTRA=0 and DENSE_CONFIRM="" (no confirm of the MoE
# extras and the dense cut before export: export_cut's; both were swept only), TF_NEW=1 (MODEL_RUNS again with the transformers of
# .whl/transformers-new/: benchmarks/slim_wheel.py), ROWS (a folder with the moe-, dense- and
# fp8-rows.csv an earlier call cut and confirmed, its results' rows/: exported as they are, no confirm: a
# bare GPU host spent 250 s of a call confirming the extras and the dense cut).
set -uo pipefail
final=${1:?output directory}
budget=${BUDGET:-540}
state=/tmp/native-moe; out=$state/results; mkdir -p "$final" "$out"
# the device hands back a few files only: everything travels as one archive
trap 'tar czf "$final/results.tgz" -C "$out" .' EXIT
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
gpu_facts "$out/gpu.txt"
python3 -m cutlass_tune.cli native --build > "$out/native.txt" 2>&1 &
export_cut_logged() {  # NAME GZ PATTERN: export_cut into the state folder, its output in OUT/NAME-export.txt
  if [ -n "${ROWS:-}" ]; then  # the rows an earlier call cut and confirmed: exported as they are
    python3 -m cutlass_tune.cli export --storage "$ROWS/$1-rows.csv" -o "$state/$1-bundle" > "$out/$1-export.txt" 2>&1
  else
    export_cut "$state" "$@" > "$out/$1-export.txt" 2>&1
  fi
  local rc=$?; echo "$1 export rc=$rc"
  mkdir -p "$out/rows" && cp "${ROWS:-$state}/$1-rows.csv" "$out/rows/" 2>/dev/null  # for ROWS= in a later call
}
CUT_CONFIRM_EXTRA=${MOE_CONFIRM_EXTRA:-1} CUT_EXTRA=${MOE_EXTRA-$CUT_MOE_EXTRA} \
  export_cut_logged moe "$CUT_MOE_STORE" "${MOE_PATTERN:-$CUT_MOE_PATTERN}" &
CUT_CONFIRM=${DENSE_CONFIRM---problem 8192x1024x1024_bf16bf16bf16_tn --problem 8192x1024x1024_bf16bf16bf16_tn_bias --problem 8192x4096x1024_bf16bf16bf16_tn_bias+gelu} \
  export_cut_logged dense "$CUT_DENSE_STORE" "$CUT_DENSE_PATTERN" &
export_cut_logged fp8 "$CUT_FP8_STORE" "$CUT_FP8_PATTERN" &
model_table=$state/moe-bundle
if [ -n "${MODEL_TABLE:-}" ]; then  # the model runs' own table (e.g. tune-model's in-model table), exported
  model_table=$state/model-bundle
  python3 -m cutlass_tune.cli export --storage "$MODEL_TABLE" -o "$model_table" > "$out/model-export.txt" 2>&1 &
fi
wait
echo "setup done at ${SECONDS}s"; tail -2 "$out/native.txt"
[ -z "${PRE:-}" ] || { eval "$PRE" > "$out/pre.txt" 2>&1; echo "pre rc=$?"; tail -25 "$out/pre.txt"; }
if [ -n "${TEST_PATHS:-}" ]; then
  # SIGINT, not SIGTERM: pytest stops as at ^C. -v: each test's outcome is printed as it ends, since
  # xdist's teardown on the interrupt can lose the summary (an INTERNALERROR in place of -rA's list).
  timeout -s INT -k 30 ${TEST_SECONDS:-200} python3 -m pytest -m gpu -n "${JOBS:-6}" -v -p no:cacheprovider -rA $TEST_PATHS > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$? at ${SECONDS}s"
  grep -oE "(PASSED|FAILED|ERROR) tests/[^ ]+" "$out/gpu_tests.txt" | sort -u | awk '{n[$1]++} END {for (k in n) print k, n[k]}'
  grep -E "(FAILED|ERROR) tests/|passed|failed" "$out/gpu_tests.txt" | tail -20
fi
mkdir -p "$out/model"
if [ -n "${MODEL_RUNS:-}" ]; then  # "FAMILY TOKENS FLAGS..." entries separated by ';', in place of FAMILIES x SPECS
  model_runs "$model_table" "$out" model
  if [ "${TF_NEW:-0}" = 1 ]; then  # the same runs against the newer transformers (gpu_env.sh's tf_new)
    model_runs "$model_table" "$out" model-tf-new tf_new
    python3 benchmarks/moe_model.py summary "$out/model-tf-new" 2>&1 | tail -8
  fi
  FAMILIES=" "
fi
for family in ${FAMILIES:-qwen3_235b}; do
  IFS=';' read -ra specs <<< "${SPECS:-4096 infer-compile --compile;1 decode-graphs --compile --graphs --decode;4096 infer;64 decode-graphs --compile --graphs --decode}"
  for spec in "${specs[@]}"; do
    set -- $spec; tokens=$1; shift 2
    [ "$(left)" -gt 100 ] || break
    timeout -k 10 $(( $(left) - 60 )) python3 benchmarks/moe_model.py "$model_table" "$out/model" --family "$family" \
      --tokens "$tokens" --profile --blocks 6 "$@" >> "$out/model-$family.txt" 2>&1
    echo "model $family $tokens $* rc=$? at ${SECONDS}s"
  done
done
python3 benchmarks/moe_model.py summary "$out/model" 2>&1 | tail -12
if [ -n "${LAYER_SPECS:-}" ]; then
  mkdir -p "$out/layer"
  IFS=';' read -ra cases <<< "$LAYER_SPECS"
  for case in "${cases[@]}"; do
    set -- $case
    [ "$(left)" -gt 80 ] || break
    timeout -k 10 $(( $(left) - 60 )) python3 benchmarks/moe_layer.py "$state/moe-bundle" "$out/layer" --family "$1" \
      --tokens "$2" --mode "$3" --profile >> "$out/layer-$1.txt" 2>&1
    echo "layer $case rc=$? at ${SECONDS}s"
  done
  python3 benchmarks/moe_layer.py summary "$out/layer" 2>&1 | tail -12
fi
if [ "${HOST:-1}" = 1 ] && [ "$(left)" -gt 70 ]; then
  timeout -k 10 $(( $(left) - 5 )) python3 benchmarks/host_path.py "$out/host_path" --table "$state/dense-bundle" \
    --table "$state/moe-bundle" --table "$state/fp8-bundle" ${HOST_FLAGS:---reps 9} > "$out/host_path.txt" 2>&1
  echo "host_path rc=$?"; grep "^|" "$out/host_path.txt" | head -45
fi
if [ "${FP8:-0}" = 1 ] && [ "$(left)" -gt 40 ]; then  # fp8 row-wise at M 16-64 called from Python and in graphs
  timeout -k 10 $(( $(left) - 5 )) python3 benchmarks/fp8_call_site.py "$state/fp8-bundle" "$out/fp8" ${FP8_TRACE:+--trace} > "$out/fp8_call_site.txt" 2>&1
  echo "fp8 call site rc=$?"; tail -20 "$out/fp8_call_site.txt"
fi
ls -R "$out" | head -40
