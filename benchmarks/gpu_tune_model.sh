#!/usr/bin/env bash
# In-model tuning on one GPU: `cutlass-tune tune-model` on a 4-layer Qwen3-MoE model of
# Qwen3-235B-A22B's widths (benchmarks/tune_model_qwen3.py) at 4096 tokens, compiled, with the
# committed H200 MoE store (benchmarks/results/session_20261127c/h200_moe_suite: its best table
# exported as a bundle, its two leading confirmed variants per problem the candidates).
#
#   benchmarks/gpu_tune_model.sh OUTDIR        (state in TUNE_MODEL_DIR, default /tmp/tune-model; resumable)
# Wheels carried in .whl/ are installed to /tmp/site when optuna or CUTLASS's headers are missing.
set -uo pipefail
out=${1:?output directory}
state=${TUNE_MODEL_DIR:-/tmp/tune-model}
budget=${TUNE_MODEL_SECONDS:-340}
mkdir -p "$out" "$state"
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
ct() { python3 -m cutlass_tune.cli "$@"; }
gpu_facts "$out/gpu.txt"

gz=benchmarks/results/session_20261127c/h200_moe_suite/moe-suite.sqlite.gz
[ -e "$state/moe.sqlite" ] || gunzip -c "$gz" > "$state/moe.sqlite"
if [ ! -e "$state/moe-bundle/.done" ]; then
  ct export --storage "$state/moe.sqlite" -o "$state/moe-bundle" > "$out/export.txt" 2>&1 && touch "$state/moe-bundle/.done"
  echo "export rc=$?"; tail -2 "$out/export.txt"
fi
if [ ! -e "$state/tuned.csv" ] && [ "$(left)" -gt 60 ]; then
  timeout -k 10 $(( $(left) - 5 )) python3 -m cutlass_tune.cli tune-model benchmarks/tune_model_qwen3.py:build \
    --table "$state/moe-bundle" --storage "$state/moe.sqlite" --candidates 3 --tokens 4096 --mode compiled \
    --baseline benchmarks/tune_model_qwen3.py:build_torch --out "$state/tuned.csv" > "$out/tune_model.txt" 2>&1
  echo "tune-model rc=$?"
fi
tail -40 "$out/tune_model.txt" 2>/dev/null
[ -e "$state/tuned.csv" ] || exit 0
cp "$state/tuned.csv" "$out/"
# The store now holds the in-model figures (--storage): its best table makes the same choices.
ct best --storage "$state/moe.sqlite" --format csv -o "$out/best-after.csv" > "$out/best-after.txt" 2>&1
echo "best rc=$?"
python3 - "$out/tuned.csv" "$out/best-after.csv" <<'PY'
import sys
import pandas as pd
tuned, store = (pd.read_csv(p).set_index(["gpu", "problem"]) for p in sys.argv[1:])
tuned = tuned[tuned["in_model_ratio"].notna()]
cols = ["kernel", "runtime", "in_model_ratio", "in_model_regime", "in_model_sm_mhz", "in_model_power_w"]
both = tuned[cols[:3]].join(store[[c for c in cols if c in store.columns]], rsuffix="_store", how="left")
same = (both["kernel"] == both["kernel_store"]) & (both["runtime"] == both["runtime_store"]) \
    & ((both["in_model_ratio"] - both["in_model_ratio_store"]).abs() < 1e-9)
print(both.to_string())
print(f"store's best table against --out: {int(same.sum())} of {len(both)} in-model problems the same")
PY
