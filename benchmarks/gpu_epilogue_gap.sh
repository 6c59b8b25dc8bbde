#!/usr/bin/env bash
# The epilogue gap (benchmarks/epilogue_gap.md), one GPU, one call of under 8 minutes: sweep
# benchmarks/configs/epilogue_gap_bf16.yaml (8 LLM MLP fc_in shapes x bias+gelu_tanh, bias+relu,
# bias+gelu; 10 configs each varying exactly the knobs the prediction names; raster along M and
# N; events timing paired with torch eager, racing), then confirm each problem's leader by
# sustained timing (GAP_PASSES passes, default 1) against every torch path of the same math in
# the same sampling loop (eager, torch.compile, and cuBLASLt's epilogue for bias+relu and
# bias+gelu_tanh), then the tables (benchmarks/epilogue_gap_table.py): the knobs per epilogue,
# the activation's cost, and per shape the ratio to eager, torch.compile, cuBLASLt and the
# strongest. Printed last; everything written under OUTDIR.
#
# The 30 kernels are compiled ahead on any host with nvcc 13.0 (no GPU):
#   cutlass-tune compile benchmarks/configs/epilogue_gap_bf16.yaml --cache-dir .cache/epilogue-gap
# and that folder carried to the GPU host (CUTLASS_TUNE_CACHE_DIR, default .cache/epilogue-gap);
# a kernel missing there is compiled on the GPU host, in the call's time.
#
# GPU time, estimated before any run: sweep 24 problems x 10 kernels x 2 variants, ~0.4 s each
# with racing, plus 24 baselines (eager, torch.compile compiled once per problem, cuBLASLt) ~5 s
# each: ~4 min; confirm, sustained: ~9 s per problem and pass (1.6 s settling and ten 100 ms
# blocks per side): ~3.5 min for one pass. Resumable: a step done is marked in GAP_DIR (default
# results/epilogue_gap); a call that finds the sweep done and confirmed adds a confirm pass.
#   benchmarks/gpu_epilogue_gap.sh OUTDIR
set -uo pipefail
out=${1:?output directory}
state=${GAP_DIR:-results/epilogue_gap}
budget=${GAP_SECONDS:-450}
passes=${GAP_PASSES:-1}
space=benchmarks/configs/epilogue_gap_bf16.yaml
mkdir -p "$out" "$state"
if ! python3 -c "import optuna, sqlalchemy, alembic" 2>/dev/null && compgen -G ".whlmin/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whlmin/*.whl || exit
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-$PWD/.cache/epilogue-gap}
store="$state/gap.sqlite"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader > "$state/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$state/gpu.txt"
cat "$state/gpu.txt"
left() { echo $((budget - SECONDS)); }
ct() { python3 -m cutlass_tune.cli "$@"; }

if [ ! -e "$state/swept" ]; then
  limit=$(( $(left) - 230 ))  # leave one confirm pass its time
  echo "== $(date -u +%FT%TZ) sweep with $limit s" >> "$state/sweep.txt"
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep "$space" --strategy optuna --trials 15 --batch 15 \
    --method events --paired --timeout $((limit * 6 / 10)) --storage "$store" >> "$state/sweep.txt" 2>&1
  echo "sweep rc=$? (124: stopped by this call's time, resumes)"; tail -3 "$state/sweep.txt"
  if tail -1 "$state/sweep.txt" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed"; then
    touch "$state/swept"
  fi
fi
if [ -e "$state/swept" ] && [ "$(left)" -gt 120 ]; then
  timeout -k 20 $(( $(left) - 25 )) python3 -m cutlass_tune.cli confirm --storage "$store" --top 1 \
    --passes "$passes" --method sustained >> "$state/confirm.txt" 2>&1
  rc=$?; echo "confirm rc=$rc"; tail -30 "$state/confirm.txt"
  [ $rc -eq 0 ] && touch "$state/confirmed"
fi
ct best --storage "$store" --format csv -o "$state/gap-table.csv" > "$state/best.txt" 2>&1
python3 benchmarks/epilogue_gap_table.py "$store" > "$state/epilogue_gap.md" 2>&1
cp -r "$state/." "$out/"
echo; cat "$state/gpu.txt"; cat "$state/epilogue_gap.md"
