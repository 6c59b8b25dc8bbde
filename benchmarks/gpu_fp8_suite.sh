#!/usr/bin/env bash
# fp8 row-wise suite (benchmarks/configs/fp8_suite.yaml: 10 Llama-3 shapes, M 16-16384, e4m3 ->
# bf16, rowcol) on one GPU: a sweep over kernels: auto led by the hand-picked fp8 configs
# (FP8_TRIALS configs, default 48), each problem's leader confirmed in the sustained regime
# (top 1, FP8_PASSES passes, default 3), then the call-site check against torch._scaled_mm
# (benchmarks/fp8_call_site.py: matmul with scale_a/scale_b vs torch._scaled_mm, graphs and
# Python loop); the table, with the geomean and the goal, is printed last.
#
# It resumes across calls: each call does what is left within FP8_SECONDS (default 540); the sweep
# resumes from its store, a step done is marked in the state folder, and every call writes what it
# has under OUTDIR (stores, logs, call-site JSON lines, table).
# Usage on the GPU host, from the repository root, as many calls as it takes:
#   benchmarks/gpu_fp8_suite.sh OUTDIR
# On a fresh machine, first put back the last call's state:
#   mkdir -p results/fp8 && tar xzf LAST_OUTDIR/fp8-state.tgz -C results/fp8
set -uo pipefail
out=${1:?output directory}
state=${FP8_DIR:-results/fp8}
budget=${FP8_SECONDS:-540}
trials=${FP8_TRIALS:-48}
passes=${FP8_PASSES:-3}
mkdir -p "$out" "$state"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//')
store="$state/fp8-$gpu.sqlite"
left() { echo $((budget - SECONDS)); }

if [ ! -e "$store.swept" ]; then
  limit=$(( $(left) - 20 ))
  # Stop proposing at 60% of the time, so that the last batch is measured before the hard limit.
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep benchmarks/configs/fp8_suite.yaml --trials "$trials" \
    --timeout $((limit * 6 / 10)) --storage "sqlite:///$store" >> "$state/sweep.txt" 2>&1
  echo "sweep rc=$?"; tail -2 "$state/sweep.txt"
  if tail -1 "$state/sweep.txt" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed"; then
    touch "$store.swept"
  fi
fi
if [ -e "$store.swept" ] && [ ! -e "$store.confirmed" ] && [ "$(left)" -gt 120 ]; then
  timeout -k 20 $(( $(left) - 20 )) python3 -m cutlass_tune.cli confirm --storage "sqlite:///$store" \
    --top 1 --passes "$passes" --method sustained > "$state/confirm.txt" 2>&1 && touch "$store.confirmed"
  tail -3 "$state/confirm.txt"
fi
if [ -e "$store.confirmed" ] && [ "$(left)" -gt 60 ]; then
  timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/fp8_call_site.py "sqlite:///$store" "$state" \
    > "$state/call_site.txt" 2>&1
  echo "call site rc=$?"
fi
python3 -m cutlass_tune.cli best --storage "$store" > "$state/best.txt" 2>&1
tar czf "$out/fp8-state.tgz" -C "$state" .
cp "$state/call_site.txt" "$out/" 2>/dev/null
tail -20 "$state/call_site.txt" 2>/dev/null || tail -20 "$state/best.txt"
