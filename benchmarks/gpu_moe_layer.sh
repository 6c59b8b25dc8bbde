#!/usr/bin/env bash
# The MoE experts layer and the operators' host path on one GPU (benchmarks/moe_layer.md).
#
#   benchmarks/gpu_moe_layer.sh OUTDIR     (state and results in MOE_LAYER_DIR, default /tmp/moe-layer,
#                                          copied to OUTDIR on exit; resumable: a step whose JSON is in
#                                          the state is skipped, so call it again on the same machine
#                                          until it prints "all done"; each call stops within
#                                          MOE_LAYER_SECONDS, default 350)
#
# Steps, in order:
#  1. three committed H200 stores, each cut to the rows these runs call and exported (their kernels
#     compiled in parallel, cached in CUTLASS_TUNE_CACHE_DIR):
#       moe:    benchmarks/results/session_20261127c/h200_moe_suite (the grouped rows of MOE_ROWS)
#       dense:  benchmarks/results/fusion_e2e_h200_20261127 (8192 x 1024 x 1024 plain and bias,
#               8192 x 4096 x 1024 bias+GELU: BERT-large's projections)
#       fp8:    benchmarks/results/fp8_h200_20261127/rowwise (16 x 6144 x 4096, row-wise scales)
#     and, where the package has it, the native operator extension built (native.txt).
#  2. benchmarks/host_path.py on the three bundles, native on and off (host_path/).
#  3. benchmarks/moe_layer.py for each family of FAMILIES (default "qwen3_235b deepseek_v2"):
#     4096 tokens eager and compiled, 1, 8 and 64 tokens in CUDA graphs (grouped and batched decode
#     sides), each with --profile (layer/).
#  4. with MODEL=1: benchmarks/moe_model.py, 4 layers of the same families: 4096 tokens eager and
#     compiled, 1 and 64 decode tokens compiled in CUDA graphs, each with --profile (model/).
#
# What the committed MoE store covers (its 12 confirmed rows; a grouped call takes the row of the
# same experts, N and K with the nearest routed rows M, and torch's grouped GEMM where the store
# has no row of its experts, N and K: the layer and the "cutlass_tune" experts fall back per shape,
# with one warning each, recorded in the JSON's fallbacks):
#   Qwen3-235B-A22B  gate_up 128 x 3072 x 4096 (M 2048, 32768), down 128 x 4096 x 1536 (M 32768): both
#   DeepSeek-V2-Lite gate_up 64 x 2816 x 2048 (M 49152), down 64 x 2048 x 1408 (M 49152): both
#   GPT-OSS-20B      gate_up 32 x 5760 x 2880 (M 65536), down 32 x 2880 x 2880 (M 4096): both
#   Qwen3-30B-A3B    down 128 x 2048 x 768 (M 4096) only: gate_up runs torch's
#   OLMoE-1B-7B      down 64 x 2048 x 1024 (M 4096) only: gate_up runs torch's
#   Mixtral-8x7B     none (the store's 8 x 6144 x 16384 is Mixtral-8x22B's down): torch's
#   also DeepSeek-V3 TP8 down 256 x 7168 x 256 and 16 x 12800 x 4096 (Phi-3.5-MoE's gate_up).
# Hence the default families. Wheels carried in .whl/ are installed to /tmp/site when optuna, transformers or
# CUTLASS's headers are missing (as benchmarks/gpu_seams.sh does).
set -uo pipefail
out=${1:?output directory}
state=${MOE_LAYER_DIR:-/tmp/moe-layer}
budget=${MOE_LAYER_SECONDS:-350}
families=${FAMILIES:-qwen3_235b deepseek_v2}
rows=${MOE_ROWS:-x3072x4096_|x4096x1536_|x2816x2048_|x2048x1408_}
res=$state/results
mkdir -p "$out" "$state" "$res"
trap 'cp -r "$res/." "$out/" 2>/dev/null' EXIT
GPU_ENV_NEEDS=transformers . benchmarks/gpu_env.sh || exit
left() { echo $((budget - SECONDS)); }
ct() { python3 -m cutlass_tune.cli "$@"; }
gpu_facts "$res/gpu.txt"
pending=0

# 1. the bundles: NAME GZ PATTERN (a regular expression over the best table's problem names)
export_cut() {
  local name=$1 gz=$2 pattern=$3
  [ -e "$state/$name-bundle/.done" ] && return 0
  [ "$(left)" -gt 120 ] || { pending=1; return 0; }
  [ -e "$state/$name.sqlite" ] || gunzip -c "$gz" > "$state/$name.sqlite"
  ct best --storage "$state/$name.sqlite" --format csv -o "$state/$name-best.csv" > /dev/null &&
  python3 -c "import sys, pandas as pd; t = pd.read_csv(sys.argv[1]); t = t[t.problem.str.contains(sys.argv[3])]
t.to_csv(sys.argv[2], index=False); print(len(t), 'rows:', ' '.join(t.problem))" \
    "$state/$name-best.csv" "$state/$name-rows.csv" "$pattern" > "$res/$name-export.txt" 2>&1 &&
  rm -rf "$state/$name-bundle" &&
  timeout -k 10 $(( $(left) - 10 )) python3 -m cutlass_tune.cli export --storage "$state/$name-rows.csv" \
    -o "$state/$name-bundle" >> "$res/$name-export.txt" 2>&1 && touch "$state/$name-bundle/.done"
  echo "$name export rc=$?"; tail -2 "$res/$name-export.txt"
}
# the three exports and the native build run side by side (each compiles in parallel; the host has 16 cores)
export_cut moe benchmarks/results/session_20261127c/h200_moe_suite/moe-suite.sqlite.gz "$rows" &
export_cut dense benchmarks/results/fusion_e2e_h200_20261127/fusion-e2e.sqlite.gz \
  '^8192x1024x1024_bf16bf16bf16_tn(?:_bias)?$|^8192x4096x1024_bf16bf16bf16_tn_bias\+gelu$' &
export_cut fp8 benchmarks/results/fp8_h200_20261127/rowwise/fp8_suite-nvidia-h200.sqlite.gz '^16x6144x4096_' &
if [ ! -e "$state/native.done" ] && [ "$(left)" -gt 60 ]; then
  ( timeout -k 10 $(( $(left) - 10 )) python3 -c "
from cutlass_tune.runtime import _native as n
print('build:', n.build()); print('available:', n.available())" > "$res/native.txt" 2>&1
  rc=$?
  echo "native build rc=$rc (a package without the extension says so)"; tail -3 "$res/native.txt"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] || touch "$state/native.done" ) &  # a build cut short is tried again
fi
wait
for name in moe dense fp8; do [ -e "$state/$name-bundle/.done" ] || pending=1; done

# 2. host time per call, native on and off
if [ ! -e "$res/host_path/host_path.json" ]; then
  if [ -e "$state/moe-bundle/.done" ] && [ -e "$state/dense-bundle/.done" ] && [ -e "$state/fp8-bundle/.done" ] \
      && [ "$(left)" -gt 150 ]; then
    timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/host_path.py "$res/host_path" --table "$state/dense-bundle" \
      --table "$state/moe-bundle" --table "$state/fp8-bundle" > "$res/host_path.txt" 2>&1
    echo "host_path rc=$?"; tail -30 "$res/host_path.txt"
  fi
  [ -e "$res/host_path/host_path.json" ] || pending=1
fi

# 3. the layer alone: FAMILY MODE TOKENS...
layer() {
  local family=$1 mode=$2; shift 2
  local missing=0 tokens
  for tokens in "$@"; do [ -e "$res/layer/$family-$tokens-$mode.json" ] || missing=1; done
  [ "$missing" = 1 ] || return 0
  [ -e "$state/moe-bundle/.done" ] && [ "$(left)" -gt 90 ] || { pending=1; return 0; }
  timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/moe_layer.py "$state/moe-bundle" "$res/layer" \
    --family "$family" --mode "$mode" --tokens "$@" --profile >> "$res/layer-$family.txt" 2>&1
  echo "layer $family $mode $* rc=$?"; tail -4 "$res/layer-$family.txt"
  for tokens in "$@"; do [ -e "$res/layer/$family-$tokens-$mode.json" ] || pending=1; done
}
for family in $families; do
  layer "$family" eager 4096
  layer "$family" compiled 4096
  layer "$family" graphs 1 8 64
done

# 4. the model forward (MODEL=1): FAMILY TOKENS NAME [moe_model.py options]
model() {
  local family=$1 tokens=$2 mode=$3; shift 3
  [ -e "$res/model/$family-$tokens-$mode.json" ] && return 0
  [ -e "$state/moe-bundle/.done" ] && [ "$(left)" -gt 120 ] || { pending=1; return 0; }
  timeout -k 10 $(( $(left) - 10 )) python3 benchmarks/moe_model.py "$state/moe-bundle" "$res/model" \
    --family "$family" --tokens "$tokens" --profile --blocks 6 "$@" >> "$res/model-$family.txt" 2>&1
  echo "model $family $tokens $mode rc=$?"; tail -3 "$res/model-$family.txt"
  [ -e "$res/model/$family-$tokens-$mode.json" ] || pending=1
}
if [ "${MODEL:-0}" = 1 ]; then
  for family in $families; do
    model "$family" 4096 infer
    model "$family" 4096 infer-compile --compile
    model "$family" 1 decode-graphs --compile --graphs --decode
    model "$family" 64 decode-graphs --compile --graphs --decode
  done
fi

[ -d "$res/layer" ] && python3 benchmarks/moe_layer.py summary "$res/layer"
[ -d "$res/model" ] && python3 benchmarks/moe_model.py summary "$res/model"
[ "$pending" = 0 ] && echo "all done" || echo "not done: call again (${SECONDS}s used)"
