#!/usr/bin/env bash
# Issue 45's weight gradients on one GPU (benchmarks/moe_wgrad.md): the GROUPED_K kernels checked
# (every expert against fp32 and torch._grouped_mm(g.t(), x, offs), empty experts exactly 0, graph
# replay), then a sweep of the Qwen3-235B-A22B training step's two weight gradients at 4096 tokens
# (dW of gate_up: G 32768 x 3072, X 32768 x 4096; of down: G 32768 x 4096, X 32768 x 1536) over
# kernels: auto, paired with torch._grouped_mm, uniform and zipf routing; with TT=1 then a sweep of
# the step's other grouped problems that read B row-major (benchmarks/configs/moe_tt_bf16.yaml: the
# input gradients dA = dY @ W_e and GPT-OSS's experts) into tt.sqlite; a sustained confirm of both
# stores' leading kernels where time is left; the best tables and the stores (gzipped) last.
#
# Resumable across calls (one GPU command may run 10 minutes): each step marks itself done in the
# state folder; a sweep stopped by the call's time resumes from its store.
#   benchmarks/gpu_moe_wgrad.sh OUTDIR        (state in WGRAD_DIR, default results/moe_wgrad; WGRAD_SECONDS
#   the budget, DW_SECONDS the weight gradients' sweep's most, TT=1 the tt sweep, CONFIRM=0 no confirm)
set -uo pipefail
out=${1:?output directory}
state=${WGRAD_DIR:-results/moe_wgrad}
budget=${WGRAD_SECONDS:-560}
trials=${WGRAD_TRIALS:-24}
mkdir -p "$out" "$state"
. benchmarks/gpu_env.sh || exit
gpu_facts "$state/gpu.txt"
store="$state/wgrad.sqlite"
left() { echo $((budget - SECONDS)); }

if [ ! -e "$state/checked" ]; then
  timeout -k 10 $(( $(left) - 10 )) python3 -m pytest tests/compile/test_gpu_grouped_k.py \
    tests/runtime/test_gpu_grouped_k.py -m gpu -p no:cacheprovider -v > "$state/tests.txt" 2>&1
  rc=$?
  python3 -m tests.compile.test_gpu_grouped_k "$state" >> "$state/tests.txt" 2>&1
  echo "gpu tests rc=$rc"; tail -12 "$state/tests.txt"
  [ "$rc" -eq 0 ] && touch "$state/checked"
fi
if [ -e "$state/checked" ] && [ ! -e "$state/swept" ] && [ "$(left)" -gt 120 ]; then
  limit=$(( $(left) - 20 )); [ "$limit" -le "${DW_SECONDS:-$limit}" ] || limit=$DW_SECONDS
  echo "== $(date -u +%FT%TZ) sweep with $limit s" >> "$state/sweep.txt"
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep --shapes dw128:32768x3072x4096,dw128:32768x4096x1536 \
    --routing uniform,zipf --trials "$trials" --batch 8 --timeout $((limit * 6 / 10)) --storage "$store" \
    >> "$state/sweep.txt" 2>&1
  echo "sweep rc=$?"; tail -3 "$state/sweep.txt"
  if tail -1 "$state/sweep.txt" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed"; then
    touch "$state/swept"
  fi
fi
tt="$state/tt.sqlite"
if [ "${TT:-0}" = 1 ] && [ ! -e "$state/tt-swept" ] && [ "$(left)" -gt 120 ]; then
  limit=$(( $(left) - ${CONFIRM_SECONDS:-60} ))
  echo "== $(date -u +%FT%TZ) tt sweep with $limit s" >> "$state/tt-sweep.txt"
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep benchmarks/configs/moe_tt_bf16.yaml --trials "${TT_TRIALS:-16}" \
    --batch 16 --timeout $((limit * 6 / 10)) --storage "$tt" >> "$state/tt-sweep.txt" 2>&1
  echo "tt sweep rc=$?"; tail -3 "$state/tt-sweep.txt"
  if tail -1 "$state/tt-sweep.txt" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed"; then
    touch "$state/tt-swept"
  fi
fi
for db in "$store" "$tt"; do
  [ -e "$db" ] || continue
  name=$(basename "$db" .sqlite)
  if [ "${CONFIRM:-1}" = 1 ] && [ ! -e "$state/$name-confirmed" ] && [ "$(left)" -gt 40 ]; then
    timeout -k 10 $(( $(left) - 15 )) python3 -m cutlass_tune.cli confirm --storage "$db" --top 2 --passes 3 \
      >> "$state/$name-confirm.txt" 2>&1 && touch "$state/$name-confirmed"
  fi
  python3 -m cutlass_tune.cli best --storage "$db" --wide > "$state/$name-best.txt" 2>&1
  python3 -m cutlass_tune.cli best --storage "$db" --format csv -o "$state/$name-table.csv" >> "$state/$name-best.txt" 2>&1
  cat "$state/$name-best.txt"
  gzip -kf "$db"
done
tar czf "$out/moe-wgrad-state.tgz" -C "$state" .
