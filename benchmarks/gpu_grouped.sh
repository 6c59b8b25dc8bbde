#!/usr/bin/env bash
# Issue 33's product path on one GPU: sweep configs/moe_bf16.yaml (12 grouped problems, kernels:
# auto led by the grouped prior, racing, events timing paired with torch._grouped_mm), confirm the
# leaders by sustained timing, write the best table, then call it where users do: each entry
# through cutlass_tune.grouped_mm beside torch's grouped GEMM (benchmarks/grouped_call_site.py) and
# a Qwen3-30B-A3B-shaped model with transformers' "grouped_mm" experts against "cutlass_tune"
# (benchmarks/moe_model.py). benchmarks/grouped_probe.py (12 fixed configs) is run on its own.
#
# Resumable across calls (one GPU command may run 10 minutes): each step marks itself done in the
# state folder; a sweep stopped by the call's time resumes from its store.
#   benchmarks/gpu_grouped.sh OUTDIR        (state in GROUPED_DIR, default results/grouped)
# Wheels brought along in .whlmin/ are installed to /tmp/site when optuna is missing.
set -uo pipefail
out=${1:?output directory}
state=${GROUPED_DIR:-results/grouped}
budget=${GROUPED_SECONDS:-560}
trials=${GROUPED_TRIALS:-16}
mkdir -p "$out" "$state"
if ! python3 -c "import optuna, sqlalchemy, alembic" 2>/dev/null && compgen -G ".whlmin/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whlmin/*.whl || exit
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache}
store="$state/moe-bf16.sqlite"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader > "$state/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$state/gpu.txt"
left() { echo $((budget - SECONDS)); }
ct() { python3 -m cutlass_tune.cli "$@"; }

if [ ! -e "$state/swept" ]; then
  limit=$(( $(left) - 20 ))
  echo "== $(date -u +%FT%TZ) sweep with $limit s" >> "$state/sweep.txt"
  # Stop proposing at 60% of the time, so that the last batch is measured before the hard limit.
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep configs/moe_bf16.yaml --trials "$trials" --batch 16 \
    --timeout $((limit * 6 / 10)) --storage "$store" >> "$state/sweep.txt" 2>&1
  echo "sweep rc=$?"; tail -3 "$state/sweep.txt"
  if tail -1 "$state/sweep.txt" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed"; then
    touch "$state/swept"
  fi
fi
if [ -e "$state/swept" ] && [ ! -e "$state/confirmed" ] && [ "$(left)" -gt 200 ]; then
  timeout -k 20 $(( $(left) - 20 )) python3 -m cutlass_tune.cli confirm --storage "$store" --top 2 --passes 2 \
    > "$state/confirm.txt" 2>&1 && touch "$state/confirmed"
  echo "confirm rc=$?"; tail -4 "$state/confirm.txt"
fi
if [ -e "$state/confirmed" ]; then
  ct best --storage "$store" > "$state/best.txt" 2>&1
  ct best --storage "$store" --format csv -o "$state/moe-table.csv" >> "$state/best.txt" 2>&1
  if [ ! -e "$state/call_site.json" ] && [ "$(left)" -gt 120 ]; then
    timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/grouped_call_site.py "$state/moe-table.csv" "$state" \
      > "$state/call_site.txt" 2>&1
    echo "call site rc=$?"; tail -15 "$state/call_site.txt"
  fi
  for tokens in 4096 512; do
    [ -e "$state/model-$tokens/moe_model.json" ] && continue
    [ "$(left)" -gt 90 ] || break
    timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/moe_model.py "$state/moe-table.csv" "$state/model-$tokens" \
      --tokens "$tokens" > "$state/model-$tokens.txt" 2>&1
    echo "model $tokens tokens rc=$?"; tail -4 "$state/model-$tokens.txt"
  done
fi
tar czf "$out/grouped-state.tgz" -C "$state" .
