#!/usr/bin/env bash
# Issue 45's decode regime on one GPU (benchmarks/moe_decode.md): the expert GEMMs of
# benchmarks/configs/moe_decode_bf16.yaml (three families at 1 and 64 tokens) swept and confirmed
# (sustained, then in an idle-gap regime: a one-token step in graphs leaves the GPU idle between
# layers), their best rows added to the committed MoE rows (ROWS) and OLMoE's (OLMOE_ROWS), and the
# models of MODEL_RUNS run on that table (benchmarks/moe_model.py; gpu_env.sh's model_runs).
#
#   benchmarks/gpu_moe_decode.sh OUTDIR      (BUDGET seconds, default 560)
#
# Optional: BEFORE=1 (the LAYER_SPECS cases on the table without the decode rows too), DECODE_ROWS (a decode-rows.csv an earlier call made: no sweep or confirm), LAYER_SPECS
# ("FAMILY TOKENS..." entries separated by ';': benchmarks/moe_layer.py in graphs mode, each with
# --profile), TEST_PATHS and TEST_SECONDS (GPU tests run after the models), PRE (a command run
# after the table is exported, its output in pre.txt). Kernels compiled ahead travel as
# .whl/kcache.tar.xz (gpu_env.sh).
set -uo pipefail
final=${1:?output directory}
budget=${BUDGET:-560}
state=/tmp/moe-decode; out=$state/results
# A bare GPU host may carry an older image's /tmp: results not of this machine's calls go first.
[ -e "$state/.calls" ] || rm -rf "$state"
mkdir -p "$final" "$out" && echo "$(date -u +%FT%TZ)" >> "$state/.calls"
trap 'tar czf "$final/results.tgz" -C "$out" .' EXIT
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
gpu_facts "$out/gpu.txt"
python3 -m cutlass_tune.cli native --build > "$out/native.txt" 2>&1 &
rows=${ROWS:-benchmarks/results/native_moe_h200_20261130b/1_deepseek512/rows}
olmoe_rows=${OLMOE_ROWS:-benchmarks/results/olmoe_h200_20261130/1_family/olmoe-best.csv}
if [ -n "${DECODE_ROWS:-}" ]; then
  cp "$DECODE_ROWS" "$out/decode-rows.csv"
else
  store=$state/decode.sqlite
  step sweep 150 python3 -m cutlass_tune.cli sweep benchmarks/configs/moe_decode_bf16.yaml --strategy optuna \
    --trials 8 --batch 8 --storage "$store"
  step confirm 120 python3 -m cutlass_tune.cli confirm --storage "$store" --top 3 --passes 2
  step confirm-idle 100 python3 -m cutlass_tune.cli confirm --storage "$store" --top 3 --passes 2 --regime idle-gap:200us
  python3 -m cutlass_tune.cli best --storage "$store" > "$out/best.txt" 2>&1
  python3 -m cutlass_tune.cli best --storage "$store" --format csv -o "$out/decode-rows.csv" >> "$out/best.txt" 2>&1
  echo "best rc=$?"; cat "$out/best.txt" | cut -c1-200 | tail -20
  gzip -c "$store" > "$out/decode.sqlite.gz"
fi
# One table for the models: the committed MoE rows, OLMoE's and the decode rows (problems differ).
python3 - "$out/model-rows.csv" "$rows/moe-rows.csv" "$olmoe_rows" "$out/decode-rows.csv" <<'PY' || exit
import sys
import pandas as pd
frames = [pd.read_csv(p) for p in sys.argv[2:]]
table = pd.concat(frames, ignore_index=True).drop_duplicates(["gpu", "problem"], keep="last")
table.to_csv(sys.argv[1], index=False)
print(f"model table: {len(table)} rows from {', '.join(str(len(f)) for f in frames)}")
before = pd.concat(frames[:-1], ignore_index=True).drop_duplicates(["gpu", "problem"], keep="last")
before.to_csv(sys.argv[1].replace("model-rows", "before-rows"), index=False)
PY
python3 -m cutlass_tune.cli export --storage "$out/model-rows.csv" -o "$state/model-bundle" > "$out/model-export.txt" 2>&1
echo "export rc=$? at ${SECONDS}s"; tail -3 "$out/model-export.txt"
wait; tail -2 "$out/native.txt"
[ -z "${PRE:-}" ] || { eval "$PRE" > "$out/pre.txt" 2>&1; echo "pre rc=$?"; tail -25 "$out/pre.txt"; }
# layer_runs BUNDLE NAME: each LAYER_SPECS entry ("FAMILY TOKENS...") through benchmarks/moe_layer.py
# in graphs mode on BUNDLE into OUT/NAME.
layer_runs() {
  local case fam
  mkdir -p "$out/$2"
  IFS=';' read -ra cases <<< "$LAYER_SPECS"
  for case in "${cases[@]}"; do
    set -- "$1" "$2" $case; fam=$3
    [ "$(left)" -gt 80 ] || break
    timeout -k 10 $(( $(left) - 60 )) python3 benchmarks/moe_layer.py "$1" "$out/$2" --family "$fam" \
      --tokens "${@:4}" --mode graphs --profile >> "$out/$2-$fam.txt" 2>&1
    echo "$2 $case rc=$? at ${SECONDS}s"
  done
  python3 benchmarks/moe_layer.py summary "$out/$2" 2>&1 | tail -12
}
if [ -n "${LAYER_SPECS:-}" ]; then
  layer_runs "$state/model-bundle" layer
  # BEFORE=1: the same cases on the table without the decode rows (the nearest tuned problems' kernels)
  if [ "${BEFORE:-0}" = 1 ]; then
    python3 -m cutlass_tune.cli export --storage "$out/before-rows.csv" -o "$state/before-bundle" > "$out/before-export.txt" 2>&1
    layer_runs "$state/before-bundle" layer-before
  fi
fi
model_runs "$state/model-bundle" "$out" model
python3 benchmarks/moe_model.py summary "$out/model" 2>&1 | tail -12
if [ -n "${TEST_PATHS:-}" ] && [ "$(left)" -gt 60 ]; then
  timeout -s INT -k 30 $(( $(left) - 20 )) python3 -m pytest -m gpu -n "${JOBS:-4}" -v -p no:cacheprovider -rA \
    $TEST_PATHS > "$out/gpu_tests.txt" 2>&1
  echo "tests rc=$? at ${SECONDS}s"
  grep -E "(FAILED|ERROR) tests/|passed|failed" "$out/gpu_tests.txt" | tail -20
fi
ls -R "$out" | head -40
