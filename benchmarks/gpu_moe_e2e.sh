#!/usr/bin/env bash
# MoE models end to end on one GPU: transformers' "grouped_mm" experts against "cutlass_tune",
# same weights, 4 layers of real widths (benchmarks/moe_model.py), over the matrix
#   {qwen3_moe, olmoe} x {512, 4096 tokens} x {eager, torch.compile} inference
#   + a training step (forward, loss, backward; gradients compared) of each family at 4096 tokens
# and the host time per grouped call of torch and of both cutlass_tune paths (grouped_host.py).
#   benchmarks/gpu_moe_e2e.sh OUTDIR TABLE_OR_BUNDLE
# One JSON per case in OUTDIR; a case whose JSON exists is skipped (rerun to resume); each case is
# cut at MOE_CASE_SECONDS (default 90; they take 15-60 s). The table printed last covers all cases.
#
# The table: a sweep of both families' expert GEMMs (forward at both token counts, and the
# training step's input gradients), then a bundle, from the repository root on the GPU host (the
# grouped prior leads kernels: auto; 4 configs per file, about 75 s together on an H200 with the
# kernels compiled ahead). `--trials` counts the configs compiled for the whole store, earlier
# sweeps included: the second sweep's is the running total (with 4 there, it compiles nothing).
#   python3 -m cutlass_tune.cli sweep benchmarks/configs/moe_e2e_bf16.yaml --trials 4 --batch 4 \
#     --storage results/moe-e2e.sqlite
#   python3 -m cutlass_tune.cli sweep benchmarks/configs/moe_e2e_train_bf16.yaml --trials 8 --batch 4 \
#     --storage results/moe-e2e.sqlite
#   python3 -m cutlass_tune.cli export --storage results/moe-e2e.sqlite -o results/moe-e2e-bundle
#   benchmarks/gpu_moe_e2e.sh results/moe-e2e results/moe-e2e-bundle
set -uo pipefail
out=${1:?output directory}
table=${2:?best-config table or bundle (see the header for the sweep and export commands)}
limit=${MOE_CASE_SECONDS:-90}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -e "$out/gpu.txt" ] || nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader \
  > "$out/gpu.txt"

case_() {  # FAMILY TOKENS MODE [moe_model.py options...]
  local family=$1 tokens=$2 mode=$3; shift 3
  local name="$family-$tokens-$mode"
  [ -e "$out/$name.json" ] && return 0
  timeout -k 10 "$limit" python3 benchmarks/moe_model.py "$table" "$out" --family "$family" --tokens "$tokens" "$@" \
    > "$out/$name.txt" 2>&1
  echo "$name rc=$?"
}

if [ ! -e "$out/grouped_host.json" ]; then
  timeout -k 10 "$limit" python3 benchmarks/grouped_host.py "$table" "$out" > "$out/grouped_host.txt" 2>&1
  echo "grouped_host rc=$?"
fi
for family in qwen3_moe olmoe; do
  for tokens in 512 4096; do
    case_ "$family" "$tokens" infer
    case_ "$family" "$tokens" infer-compile --compile
  done
  case_ "$family" 4096 train --train --blocks 6 --block 4
done
cat "$out/grouped_host.txt" 2>/dev/null | tail -9
python3 benchmarks/moe_model.py summary "$out"
