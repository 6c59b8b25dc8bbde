#!/usr/bin/env bash
# One call on one GPU for the MoE layer's native glue under torch.compile (runtime/_lowering.py,
# native/moe.cu; benchmarks/moe_layer.md): the native library built, benchmarks/extern_smoke.py, the
# GPU tests of TESTS (test files; default tests/runtime/test_moe_gpu.py) that TEST_K selects (a pytest -k
# expression; default "native"), then the model runs of
# SPECS ("TOKENS FLAGS..." entries separated by ';', default "512 --compile") for FAMILY (default
# deepseek_v2) on each side of SIDES (default "extern"; "dispatcher": CUTLASS_TUNE_EXTERN=0), each
# benchmarks/moe_model.py's alternating blocks against transformers' "grouped_mm" experts, with
# Inductor's caches off. Results under OUTDIR (one archive).
#
#   benchmarks/gpu_extern_moe.sh OUTDIR        (BUDGET seconds, default 560; TABLE: the model's
#                                              table, default the seventh session's DeepSeek-V2-Lite one)
set -uo pipefail
final=${1:?output directory}
budget=${BUDGET:-560}
out=/tmp/extern-moe; mkdir -p "$final" "$out"
trap 'tar czf "$final/results.tgz" -C "$out" .' EXIT
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
gpu_facts "$out/gpu.txt"
python3 -m cutlass_tune.cli export --storage "${TABLE:-benchmarks/results/moe_glu_h200_20261129g/deepseek_table.csv}" \
  -o /tmp/extern-moe-bundle > "$out/export.txt" 2>&1 &
python3 -m cutlass_tune.cli native --build > "$out/native.txt" 2>&1
echo "native rc=$? at ${SECONDS}s"; tail -2 "$out/native.txt"
python3 benchmarks/extern_smoke.py > "$out/smoke.txt" 2>&1; echo "smoke rc=$?"; grep -v Warning "$out/smoke.txt" | grep -v "return _fallback" | cut -c1-160
timeout -s INT -k 20 ${TEST_SECONDS:-200} python3 -m pytest -m gpu -s -v -p no:cacheprovider -rA \
  ${TESTS:-tests/runtime/test_moe_gpu.py} -k "${TEST_K:-native}" > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^(routing|extern)|(PASSED|FAILED|ERROR) tests|passed|failed" "$out/gpu_tests.txt" | cut -c1-400 | tail -40
wait; echo "export: $(tail -1 "$out/export.txt")"
mkdir -p "$out/model"
IFS=';' read -ra specs <<< "${SPECS:-512 --compile}"
for spec in "${specs[@]}"; do
  for side in ${SIDES:-extern}; do
    [ "$(left)" -gt 90 ] || { echo "model $spec $side: $(left) s left"; break 2; }
    ext=1; [ "$side" = dispatcher ] && ext=0
    set -- $spec; tokens=$1; shift
    CUTLASS_TUNE_EXTERN=$ext TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout -k 10 $(( $(left) - 20 )) \
      python3 benchmarks/moe_model.py /tmp/extern-moe-bundle "$out/model/$side" --family "${FAMILY:-deepseek_v2}" \
      --tokens "$tokens" --profile --blocks ${BLOCKS:-8} "$@" >> "$out/model-$side.txt" 2>&1
    echo "model $spec $side rc=$? at ${SECONDS}s"; tail -1 "$out/model-$side.txt" | cut -c1-300
  done
done
