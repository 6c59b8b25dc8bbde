#!/usr/bin/env bash
# One call on one GPU for the MoE layer's operators as Inductor's extern kernels
# (runtime/_lowering.py; benchmarks/host_path.md, "The MoE layer's operators"): the native library
# built, benchmarks/extern_smoke.py, the GPU tests of TESTS (a pytest -k expression, default the
# extern ones), then the DeepSeek-V2-Lite-shaped model compiled at TOKENS (default 512) with the
# extern kernels and with CUTLASS_TUNE_EXTERN=0 (the dispatcher's calls; Inductor's caches off in
# both), each benchmarks/moe_model.py's alternating blocks against transformers' "grouped_mm"
# experts. Results under OUTDIR (one archive).
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
python3 benchmarks/extern_smoke.py > "$out/smoke.txt" 2>&1; echo "smoke rc=$?"; cat "$out/smoke.txt" | cut -c1-200
timeout -s INT -k 20 ${TEST_SECONDS:-200} python3 -m pytest -m gpu -s -v -p no:cacheprovider -rA \
  tests/runtime/test_native_gpu.py -k "${TESTS:-extern}" > "$out/gpu_tests.txt" 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^(extern|PASSED|FAILED|ERROR)|passed|failed" "$out/gpu_tests.txt" | cut -c1-600 | tail -12
wait; echo "export: $(tail -1 "$out/export.txt")"
mkdir -p "$out/model"
for side in extern dispatcher; do
  [ "$(left)" -gt 100 ] || { echo "model $side: $(left) s left"; break; }
  ext=1; [ "$side" = dispatcher ] && ext=0
  CUTLASS_TUNE_EXTERN=$ext TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout -k 10 $(( $(left) - 30 )) \
    python3 benchmarks/moe_model.py /tmp/extern-moe-bundle "$out/model/$side" --family "${FAMILY:-deepseek_v2}" \
    --tokens "${TOKENS:-512}" --compile --profile --blocks ${BLOCKS:-8} > "$out/model-$side.txt" 2>&1
  echo "model $side rc=$? at ${SECONDS}s"; tail -6 "$out/model-$side.txt" | cut -c1-300
done
