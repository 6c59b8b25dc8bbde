#!/usr/bin/env bash
# fp8 suites on one GPU: FP8_CONFIG, default benchmarks/configs/fp8_suite.yaml (row-wise: 10 Llama-3
# shapes, M 16-16384, e4m3 -> bf16, rowcol); benchmarks/configs/fp8_blockwise_suite.yaml is the
# block-wise one (11 DeepSeek-V3 and Qwen3 shapes). A sweep over the file's kernels (FP8_TRIALS
# configs, default 48), each problem's leader confirmed in the sustained regime (top 1,
# FP8_PASSES passes, default 3), then the call-site check against torch's path
# (benchmarks/fp8_call_site.py: matmul with scale_a/scale_b vs torch._scaled_mm, or the
# dequantized bf16 GEMM for block-wise scales where this torch has no block-wise _scaled_mm;
# graphs and Python loop); the table, with the geomeans and the goals, is printed last.
#
# It resumes across calls: each call does what is left within FP8_SECONDS (default 540); the sweep
# resumes from its store, a step done is marked in the state folder, and every call writes what it
# has under OUTDIR (the state folder's tarball, the suite's call-site table). Each suite keeps its
# store, logs and call-site lines under names of its config's stem (fp8_suite-GPU.sqlite,
# fp8_suite-sweep.txt, fp8_suite/fp8_call_site.jsonl, ...), so both run one after the other in
# the same FP8_DIR, and one tarball holds both.
# Usage on the GPU host, from the repository root, as many calls as it takes:
#   benchmarks/gpu_fp8_suite.sh OUTDIR
#   FP8_CONFIG=benchmarks/configs/fp8_blockwise_suite.yaml benchmarks/gpu_fp8_suite.sh OUTDIR
# On a fresh machine, first put back the last call's state:
#   mkdir -p results/fp8 && tar xzf LAST_OUTDIR/fp8-state.tgz -C results/fp8
set -uo pipefail
out=${1:?output directory}
config=${FP8_CONFIG:-benchmarks/configs/fp8_suite.yaml}
state=${FP8_DIR:-results/fp8}
budget=${FP8_SECONDS:-540}
trials=${FP8_TRIALS:-48}
passes=${FP8_PASSES:-3}
[ -f "$config" ] || { echo "FP8_CONFIG: no such file: $config" >&2; exit 2; }
suite=$(basename "$config" .yaml)
mkdir -p "$out" "$state/$suite"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//')
store="$state/$suite-$gpu.sqlite"
log="$state/$suite"
left() { echo $((budget - SECONDS)); }

if [ ! -e "$store.swept" ]; then
  limit=$(( $(left) - 20 ))
  # Stop proposing at 60% of the time, so that the last batch is measured before the hard limit.
  timeout -k 20 "$limit" python3 -m cutlass_tune.cli sweep "$config" --trials "$trials" \
    --timeout $((limit * 6 / 10)) --storage "sqlite:///$store" >> "$log-sweep.txt" 2>&1
  echo "sweep rc=$?"; tail -2 "$log-sweep.txt"
  # Swept: the budget or the space ran out, or the sweep's own timeout stopped it after the
  # budget's last config was compiled (pairs it had not measured stay so: on a fresh machine a new
  # sweep would first compile every config again to measure them).
  compiled=$(grep -o "compiled [0-9]* configs, compiling 0 more" "$log-sweep.txt" | tail -1 | grep -o "[0-9]*" | head -1)
  if tail -1 "$log-sweep.txt" | grep -q "stopped: trial budget reached\|stopped: no new configs proposed" \
      || { tail -1 "$log-sweep.txt" | grep -q "stopped: timeout" && [ "${compiled:-0}" -ge "$trials" ]; }; then
    touch "$store.swept"
  fi
fi
if [ -e "$store.swept" ] && [ ! -e "$store.confirmed" ] && [ "$(left)" -gt 120 ]; then
  timeout -k 20 $(( $(left) - 20 )) python3 -m cutlass_tune.cli confirm --storage "sqlite:///$store" \
    --top 1 --passes "$passes" --method sustained > "$log-confirm.txt" 2>&1 && touch "$store.confirmed"
  tail -3 "$log-confirm.txt"
fi
if [ -e "$store.confirmed" ] && [ "$(left)" -gt 60 ]; then
  timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/fp8_call_site.py "sqlite:///$store" "$state/$suite" \
    > "$log-call_site.txt" 2>&1
  echo "call site rc=$?"
fi
python3 -m cutlass_tune.cli best --storage "$store" > "$log-best.txt" 2>&1
tar czf "$out/fp8-state.tgz" -C "$state" .
cp "$log-call_site.txt" "$out/" 2>/dev/null
tail -20 "$log-call_site.txt" 2>/dev/null || tail -20 "$log-best.txt"
