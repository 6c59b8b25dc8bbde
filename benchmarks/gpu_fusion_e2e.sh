#!/usr/bin/env bash
# Fusion end to end on one GPU: BERT-, GPT-NeoX- and LLaMA-like transformers models (real widths,
# a few layers, random bf16 weights; benchmarks/fusion_model.py) with the tuned fused GEMMs against
# the same weights plain, over
#   {bert, gpt_neox, llama} x {infer (patch, eager), infer-compile (inductor_options), train (patch)}
#   benchmarks/gpu_fusion_e2e.sh OUTDIR TABLE_OR_BUNDLE
# One JSON per case in OUTDIR; a case whose JSON exists is skipped (rerun to resume); each case is
# cut at FUSION_CASE_SECONDS (default 90). The table printed last covers all cases: sites fused,
# median ms per step of each side (sustained: alternating blocks timed by CUDA events), speedup,
# the output's relative error (and the gradients' for train).
#
# The table: one sweep of the models' fused (and plain) problems, then a bundle, from the
# repository root on the GPU host (25 kernels: ping-pong 128x128 with and without C, two
# cooperative tiles, per epilogue; --trials counts the configs compiled for the whole store, so a
# second sweep into the same store needs the sum of both counts):
#   python3 -m cutlass_tune.cli sweep benchmarks/configs/fusion_e2e_bf16.yaml --trials 25 --batch 16 \
#     --storage results/fusion-e2e.sqlite
#   python3 -m cutlass_tune.cli export --storage results/fusion-e2e.sqlite -o results/fusion-e2e-bundle
#   benchmarks/gpu_fusion_e2e.sh results/fusion-e2e results/fusion-e2e-bundle
# A model's problems can be recorded instead of written by hand: `cutlass-tune shapes MODEL.py:build`
# writes the same fused problems (gated up GEMMs as silu+gated, residual adds as residual).
set -uo pipefail
out=${1:?output directory}
table=${2:?best-config table or bundle (see the header for the sweep and export commands)}
limit=${FUSION_CASE_SECONDS:-90}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -e "$out/gpu.txt" ] || nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader \
  > "$out/gpu.txt"

case_() {  # FAMILY MODE [fusion_model.py options...]
  local family=$1 mode=$2; shift 2
  local name
  name=$(ls "$out"/"$family"-*-"$mode".json 2>/dev/null | head -1)
  [ -n "$name" ] && return 0
  timeout -k 10 "$limit" python3 benchmarks/fusion_model.py "$table" "$out" --family "$family" --mode "$mode" "$@" \
    > "$out/$family-$mode.txt" 2>&1
  echo "$family $mode rc=$? (124: cut at $limit s; see $out/$family-$mode.txt)"
}

for family in bert gpt_neox llama; do
  case_ "$family" infer
  case_ "$family" infer-compile
  case_ "$family" train --blocks 5 --block 3
done
python3 benchmarks/fusion_model.py summary "$out"
