#!/usr/bin/env bash
# One run of the multi-GPU comparison (benchmarks/multi_gpu.md): the same sweep on GPU 0 ("one"),
# on GPUs 0 and 1 ("two") or on GPUs 0-3 ("four"), each with its own empty kernel cache and store.
# Usage (on a host with two (four) GPUs of one model, wheels installed):
#   benchmarks/gpu_multi_gpu.sh OUT one|two|four [TRIALS [CONFIG]]     (default 32 configs of configs/sm90_bf16.yaml)
set -euo pipefail
usage="usage: gpu_multi_gpu.sh OUT one|two|four [TRIALS [CONFIG]]"
out=${1:?$usage}
name=${2:?$usage}
trials=${3:-32}
config=${4:-configs/sm90_bf16.yaml}
case $name in
  one) gpus=(--gpu 0) ;;
  two) gpus=(--gpu 0 --gpu 1) ;;
  four) gpus=(--gpu 0 --gpu 1 --gpu 2 --gpu 3) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
tag=$(basename "$config" .yaml)-$name
mkdir -p "$out"
rm -rf "/tmp/ctc-multi-$tag"
start=$(date +%s.%N)
CUTLASS_TUNE_CACHE_DIR=/tmp/ctc-multi-$tag python3 -m cutlass_tune.cli sweep "$config" \
  --trials "$trials" --jobs 16 --storage "sqlite:///$out/multi-$tag.sqlite" "${gpus[@]}" \
  > "$out/multi_$tag.txt" 2>&1
end=$(date +%s.%N)
echo "$tag: $(python3 -c "print(f'{$end - $start:.1f}')") s wall, $trials configs" | tee -a "$out/multi_wall.txt"
