#!/usr/bin/env bash
# One call on one H200 for the MoE layer's GLU stage (benchmarks/moe_glu.md): the gate_up GLU
# problems of benchmarks/configs/moe_glu_bf16.yaml (Qwen3-235B: 128 experts, 32768x3072x4096;
# DeepSeek-V2-Lite: 64 experts, 24576x2816x2048; uniform, epilogue silu+glu) swept over its eleven
# kernels, the best rows exported in one bundle with the committed MoE store's rows of the two
# families (gate_up and down), then the layer of each of FAMILIES (benchmarks/moe_layer.py, 4096
# tokens, compiled, inference) with the GLU stage off ("moe_experts") and on ("moe_glu", and the
# "cutlass_tune" experts) against torch's "grouped_mm". Results under OUTDIR (results.tgz).
#
#   benchmarks/gpu_moe_glu.sh OUTDIR      (BUDGET seconds, default 300)
#
# Optional: TESTS=1 also runs the GLU GPU tests (GLU_TESTS, default tests/runtime/test_moe_glu_gpu.py
# tests/compile/test_gpu_grouped_glu.py) at the end, if time is left; TRIALS (default 11); PLAIN_ROWS (a
# table CSV whose Qwen3-235B gate_up and down rows the bundle takes in place of the committed store's,
# e.g. tune-model's in-model table); FAMILIES (default "qwen3_235b deepseek_v2"); MODEL_RUNS (model forwards
# on the same bundle, gpu_env.sh's model_runs; TF_NEW=1 again under the newer transformers); ROUTING=captured
# sweeps the GLU problems with the routing each family's router gives (`shapes --device cuda` of one
# layer) instead of the uniform ones.
set -uo pipefail
final=${1:?output directory}
budget=${BUDGET:-300}
state=/tmp/moe-glu; out=$state/results; mkdir -p "$final" "$out"
# the device hands back a few files only: everything travels as one archive
trap 'tar czf "$final/results.tgz" -C "$out" .' EXIT
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
gpu_facts "$out/gpu.txt"
# The MoE store's Qwen3-235B rows, exported alone first so that their kernels compile (into the
# kernel cache) while the sweep compiles its own; the final export finds both in the cache.
plain='x3072x4096_bf16bf16bf16_tn_grouped_e|x4096x1536_bf16bf16bf16_tn_grouped_e|x2816x2048_bf16bf16bf16_tn_grouped_e|x2048x1408_bf16bf16bf16_tn_grouped_e'
if [ -n "${PLAIN_ROWS:-}" ]; then
  cut_rows "$PLAIN_ROWS" "$state/moe-rows.csv" "$plain" &&
  python3 -m cutlass_tune.cli export --storage "$state/moe-rows.csv" -o "$state/moe-plain" --jobs 6 > "$out/moe-export.txt" 2>&1 &
else
  export_cut "$state" moe benchmarks/results/session_20261127c/h200_moe_suite/moe-suite.sqlite.gz "$plain" --jobs 6 \
    > "$out/moe-export.txt" 2>&1 &
fi
moe_pid=$!
space=benchmarks/configs/moe_glu_bf16.yaml
if [ "${ROUTING:-uniform}" = captured ]; then
  # The GLU problems with the routing the layer's router gives (a histogram), recorded from one
  # layer of each family run on the GPU (benchmarks/tune_model_qwen3.py's *_routed), swept over the
  # same eleven kernels as the uniform ones.
  for family in ${FAMILIES:-qwen3_235b deepseek_v2}; do
    timeout -k 10 120 python3 -m cutlass_tune.cli shapes "benchmarks/tune_model_qwen3.py:${family}_routed" \
      --device cuda -o "$state/cap-$family.yaml" > "$out/shapes-$family.txt" 2>&1
    echo "shapes $family rc=$? at ${SECONDS}s"; grep -h "grouped_glu" "$out/shapes-$family.txt" | head -3
  done
  # torch's experts pose the plain grouped problems (cap-*_grouped.yaml), whose gate_up glu_space.py makes a GLU problem
  shopt -s nullglob; captured=("$state"/cap-*_grouped_glu.yaml "$state"/cap-*_grouped.yaml); shopt -u nullglob
  if [ ${#captured[@]} -gt 0 ] && python3 benchmarks/glu_space.py "$state/glu-captured.yaml" "${captured[@]}" > "$out/space.txt" 2>&1
  then space=$state/glu-captured.yaml; else echo "no captured GLU problems: the uniform ones are swept"; fi
  cat "$out/space.txt"
fi
timeout -k 10 $((budget * 55 / 100)) python3 -m cutlass_tune.cli sweep "$space" \
  --strategy optuna --trials "${TRIALS:-11}" --batch 11 --jobs 10 --storage "$state/glu.sqlite" \
  > "$out/sweep.txt" 2>&1
echo "sweep rc=$? at ${SECONDS}s"; tail -12 "$out/sweep.txt"
# the dispatcher runs no kernel on a sweep's single launches alone: its leaders confirmed back to back
timeout -k 10 $((budget * 10 / 100)) python3 -m cutlass_tune.cli confirm --storage "$state/glu.sqlite" --top 1 --passes 2 \
  > "$out/confirm.txt" 2>&1
echo "confirm rc=$? at ${SECONDS}s"; tail -3 "$out/confirm.txt"
python3 -m cutlass_tune.cli best --storage "$state/glu.sqlite" > "$out/glu-best.txt" 2>&1
python3 -m cutlass_tune.cli best --storage "$state/glu.sqlite" --format csv -o "$state/glu-best.csv" >> "$out/glu-best.txt" 2>&1
cat "$out/glu-best.txt"
wait "$moe_pid"; echo "moe rows export rc=$? at ${SECONDS}s"; tail -3 "$out/moe-export.txt"
python3 -c "import sys, pandas as pd; pd.concat([pd.read_csv(p) for p in sys.argv[2:]]).to_csv(sys.argv[1], index=False)" \
  "$out/table.csv" "$state/moe-rows.csv" "$state/glu-best.csv" &&
python3 -m cutlass_tune.cli export --storage "$out/table.csv" -o "$state/bundle" > "$out/export.txt" 2>&1
echo "export rc=$? at ${SECONDS}s"; tail -3 "$out/export.txt"
for family in ${FAMILIES:-qwen3_235b deepseek_v2}; do
  [ "$(left)" -gt 40 ] || break
  timeout -s INT -k 10 $(( $(left) - 10 )) python3 benchmarks/moe_layer.py "$state/bundle" "$out/layer" --family "$family" \
    --tokens 4096 --mode compiled --blocks 6 --block 5 --profile --sides cutlass_tune,moe_experts,moe_glu \
    > "$out/layer-$family.txt" 2>&1
  echo "layer $family rc=$? at ${SECONDS}s"; grep -E "fallback|skipped|gate_up path" "$out/layer-$family.txt" | head -8
done
python3 benchmarks/moe_layer.py summary "$out/layer"
grep -h "^==" "$out/layer/"*-profile.txt 2>/dev/null
if [ -n "${MODEL_RUNS:-}" ]; then  # the model forwards on the same bundle (gpu_env.sh's model_runs)
  model_runs "$state/bundle" "$out" model
  [ "${TF_NEW:-0}" != 1 ] || model_runs "$state/bundle" "$out" model-tf-new tf_new
  for name in model model-tf-new; do [ ! -d "$out/$name" ] || python3 benchmarks/moe_model.py summary "$out/$name" 2>&1 | tail -8; done
fi
if [ "${TESTS:-0}" = 1 ] && [ "$(left)" -gt 60 ]; then
  # shellcheck disable=SC2086  # GLU_TESTS is a list of pytest arguments
  timeout -s INT -k 10 $(( $(left) - 5 )) python3 -m pytest -m gpu -q -p no:cacheprovider -rA -s \
    ${GLU_TESTS:-tests/runtime/test_moe_glu_gpu.py tests/compile/test_gpu_grouped_glu.py} > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|GLU kernel|^glu " "$out/gpu_tests.txt" | tail -20
fi
