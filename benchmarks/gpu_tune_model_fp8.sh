#!/usr/bin/env bash
# In-model tuning of a dense fp8 model on one GPU (benchmarks/regimes.md, "Dense fp8 model"): the
# row-wise fp8 GEMMs of 4 Llama-3-8B-shaped blocks (benchmarks/tune_model_fp8.py) at 128 and 2048
# tokens recorded by `shapes`, swept, confirmed in the sustained and idle-gap regimes, exported, then
# tuned inside the compiled model; last, per GEMM the sweep, sustained, idle-gap and in-model ratios
# side by side (OUT/ratios.txt). MODES (default compiled; e.g. "compiled graphs") and TOKENS (default
# "128 2048") choose tune-model's runs, BLOCKS its A/B's blocks a side (default 10). tune-model's A/B of the whole step (in-model table against the
# exported, sustained-chosen one, torch's path through the product and the same model on torch's own
# path, `build_torch`), each side's kernel time split from a profile, is at each token count.
#
#   benchmarks/gpu_tune_model_fp8.sh OUTDIR    (state in TUNE_MODEL_DIR, default /tmp/tune-model-fp8;
#                                              each finished step is skipped on a rerun)
# A call stops starting steps when fewer than a step's seconds are left of TUNE_MODEL_SECONDS (default
# 340): run it again (same OUTDIR) to go on. The device hands a machine back when idle, and the state
# with it: every call leaves the state (store, problems, step markers; not the bundle, which export
# remakes) in OUTDIR/state.tgz, and RESUME=PATH (such a state.tgz committed or carried) starts the
# next call from it. Wheels carried in .whl/ are installed when optuna or CUTLASS's headers are missing.
set -uo pipefail
out=${1:?output directory}
state=${TUNE_MODEL_DIR:-/tmp/tune-model-fp8}
budget=${TUNE_MODEL_SECONDS:-340}
trials=${TRIALS:-8}
modes=${MODES:-compiled}   # tune-model's modes, each a step of its own: compiled, graphs, eager
tokens=${TOKENS:-128 2048}
model=benchmarks/tune_model_fp8.py
mkdir -p "$out" "$state"
if [ -n "${RESUME:-}" ] && [ ! -e "$state/fp8.sqlite" ]; then tar xzf "$RESUME" -C "$state" || exit; fi
# REDO="step ..." runs those steps again; a state without its bundle (state.tgz leaves it out) exports again
for name in ${REDO:-}; do rm -f "$state/$name.done"; done
[ -d "$state/bundle" ] || rm -f "$state/export.done"
trap 'tar czf "$out/state.tgz" --exclude=./bundle -C "$state" .' EXIT
. benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
ct=(python3 -m cutlass_tune.cli)  # an array, not a function: `timeout` runs it
gpu_facts "$out/gpu.txt"
store=$state/fp8.sqlite

step shapes 20 "${ct[@]}" shapes "$model:both" -o "$state/fp8.yaml" || exit
step sweep 150 "${ct[@]}" sweep "$state/fp8.yaml" --trials "$trials" --storage "$store" || exit
step confirm-sustained 60 "${ct[@]}" confirm --storage "$store" --top 2 --passes 2 --regime sustained || exit
step confirm-idle-gap 60 "${ct[@]}" confirm --storage "$store" --top 2 --passes 2 --regime idle-gap:1000us || exit
# export writes a directory that must not exist yet: a failed one is removed before the next try
[ -e "$state/export.done" ] || rm -rf "$state/bundle"
step export 60 "${ct[@]}" export --storage "$store" -o "$state/bundle" || exit
counts=(); for n in $tokens; do counts+=(--tokens "$n"); done
first=1
for mode in $modes; do  # the first mode's table is tuned.csv (ratios.txt reads it), the others' tuned-MODE.csv
  if [ -n "$first" ]; then name=tune-model; tuned=$state/tuned.csv
  else name=tune-model-$mode; tuned=$state/tuned-$mode.csv; fi
  step "$name" 170 "${ct[@]}" tune-model "$model:build" --table "$state/bundle" --storage "$store" --candidates 2 \
    "${counts[@]}" --mode "$mode" --out "$tuned" --baseline "$model:build_torch" ${BLOCKS:+--blocks "$BLOCKS"} || exit
  cp "$tuned" "$out/"; first=
done
"${ct[@]}" best --storage "$store" --format csv -o "$out/fp8-best.csv" > /dev/null || exit
python3 - "$out/fp8-best.csv" "$state/tuned.csv" <<'PY' | tee "$out/ratios.txt"
import sys

import pandas as pd

from cutlass_tune.tables import regime_figures

best, tuned = (pd.read_csv(p).set_index("problem") for p in sys.argv[1:])
print(f"{'problem':46} {'sweep':>6} {'sustained':>9} {'idle-gap':>8} {'in-model':>8}  in-model kernel")
for problem, r in best.iterrows():
    regimes = {name.split(":")[0]: ratio for name, ratio, _, _ in regime_figures(r)}
    t = tuned.loc[problem] if problem in tuned.index else None
    in_model = float("nan") if t is None else t["in_model_ratio"]
    same = "-" if t is None else "the table's" if t["config_hash"] == r["config_hash"] else f"another ({t['kernel']})"
    print(f"{problem:46} {r['sweep_ratio']:6.3f} {regimes.get('sustained', float('nan')):9.3f} "
          f"{regimes.get('idle-gap', float('nan')):8.3f} {in_model:8.3f}  {same}")
PY
