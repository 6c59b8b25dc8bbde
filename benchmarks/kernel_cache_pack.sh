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
for cut in moe dense fp8; do
  upper=${cut^^}; store=CUT_${upper}_STORE pattern=CUT_${upper}_PATTERN extra=CUT_${upper}_EXTRA
  CUT_EXTRA=${!extra:-} export_cut "$work" "$cut" "${!store}" "${!pattern}" > "$work/$cut.txt" 2>&1 ||
    { tail -3 "$work/$cut.txt"; exit 1; }
done
mkdir -p .whl && tar cJf .whl/kcache.tar.xz -C "$cache" v1/kernels v1/units && rm -rf "$work"
ls -la .whl/kcache.tar.xz
