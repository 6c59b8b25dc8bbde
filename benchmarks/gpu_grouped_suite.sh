#!/usr/bin/env bash
# Issue 33's show suite on one GPU: the twelve expert GEMMs of benchmarks/configs/moe_suite_bf16.yaml
# (six MoE families, none in the table), swept over their four kernels (racing, events
# timing paired with torch._grouped_mm, every variant verified expert by expert), the best table
# written, and each entry called where users call it: cutlass_tune.grouped_mm beside torch's
# grouped GEMM, sustained (benchmarks/grouped_call_site.py).
#   benchmarks/gpu_grouped_suite.sh OUTDIR
# The kernels are compiled ahead (on any host with nvcc: `cutlass-tune compile
# benchmarks/configs/moe_suite_bf16.yaml --cache-dir DIR`) and their cache passed in
# CUTLASS_TUNE_CACHE_DIR, so that the GPU's time goes to measuring. Everything lands in OUTDIR as
# it is made. Wheels brought along in .whlmin/ are installed to /tmp/site when optuna is missing.
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
if ! python3 -c "import optuna, sqlalchemy, alembic" 2>/dev/null && compgen -G ".whlmin/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whlmin/*.whl || exit
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader > "$out/gpu.txt"
store="$out/suite.sqlite"
start=$SECONDS
python3 -m cutlass_tune.cli sweep benchmarks/configs/moe_suite_bf16.yaml --strategy optuna --trials 4 --batch 4 \
  --storage "$store" > "$out/sweep.txt" 2>&1
echo "sweep rc=$? in $((SECONDS - start)) s (compile included)" | tee -a "$out/sweep.txt"
python3 -m cutlass_tune.cli best --storage "$store" > "$out/best.txt" 2>&1
python3 -m cutlass_tune.cli best --storage "$store" --format csv -o "$out/suite-table.csv" >> "$out/best.txt" 2>&1
python3 benchmarks/grouped_call_site.py "$out/suite-table.csv" "$out" --blocks "${SUITE_BLOCKS:-8}" \
  --block-ms "${SUITE_BLOCK_MS:-100}" > "$out/call_site.txt" 2>&1
echo "call site rc=$?"; tail -15 "$out/call_site.txt"
