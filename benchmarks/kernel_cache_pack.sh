#!/usr/bin/env bash
# The kernels of the committed stores' cuts that benchmarks/gpu_native_moe.sh exports (MoE with its tt and
# weight-gradient extras, dense, fp8 row-wise), compiled here on the CPU host into a fresh kernel cache
# and packed as .whl/kcache.tar.xz (about 0.6 MB: the libraries compress 12x), which gpu_env.sh unpacks
# into the GPU host's cache. Keys hold nvcc's version, CUTLASS's and the flags: the export lines on
# the GPU host say "cached" where they match (nvcc 13.0.88 on both hosts on 2026-11-30).
#
#   benchmarks/kernel_cache_pack.sh      (about 6 minutes on 2 cores)
set -uo pipefail
. benchmarks/gpu_env.sh || exit
work=$(mktemp -d); cache=$work/cache
export CUTLASS_TUNE_CACHE_DIR=$cache CUTLASS_TUNE_NATIVE=0
CUT_EXTRA="benchmarks/results/moe_train_h200_20261129d/1_wgrad_tt_sweeps/tt.sqlite.gz benchmarks/results/moe_train_h200_20261129d/1_wgrad_tt_sweeps/wgrad.sqlite.gz" \
  export_cut "$work" moe benchmarks/results/session_20261127c/h200_moe_suite/moe-suite.sqlite.gz \
  "x3072x4096_|x4096x1536_|x2816x2048_|x2048x1408_|x5760x2880_|x2880x2880_" > "$work/moe.txt" 2>&1 || { tail -3 "$work/moe.txt"; exit 1; }
export_cut "$work" dense benchmarks/results/fusion_e2e_h200_20261127/fusion-e2e.sqlite.gz \
  '^8192x1024x1024_bf16bf16bf16_tn(?:_bias)?$|^8192x4096x1024_bf16bf16bf16_tn_bias\+gelu$' > "$work/dense.txt" 2>&1 || { tail -3 "$work/dense.txt"; exit 1; }
export_cut "$work" fp8 benchmarks/results/fp8_h200_20261127/rowwise/fp8_suite-nvidia-h200.sqlite.gz '^(16|32|64)x' \
  > "$work/fp8.txt" 2>&1 || { tail -3 "$work/fp8.txt"; exit 1; }
mkdir -p .whl && tar cJf .whl/kcache.tar.xz -C "$cache" v1/kernels v1/units && rm -rf "$work"
ls -la .whl/kcache.tar.xz
