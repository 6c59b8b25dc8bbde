#!/usr/bin/env bash
# fp8 MoE experts with block-wise scales (issue 35, item 2's grouped part) on one GPU, one call
# (< 6 min on a 16-core host that compiles its kernels): whether this torch has a block-wise grouped
# GEMM (F.scaled_grouped_mm), the GPU tests (tests/runtime/test_grouped_fp8_gpu.py: every expert of
# uneven routing with 0- and 1-row experts against the fp32 reference of the dequantized math, new
# routing in place and in a CUDA graph, torch's path, a tiny space swept end to end), then a sweep
# of benchmarks/configs/moe_fp8_blockwise.yaml (seven Qwen3-FP8 / DeepSeek-V3 expert GEMMs, its six
# kernels, events timing paired with dequantize + torch._grouped_mm, the expert loop of
# torch._scaled_mm block-wise and the dense ceiling in the baseline rows) and its ratios.
#   benchmarks/gpu_fp8_grouped.sh [OUTDIR]       (default results/fp8-grouped; FP8G_SWEEP_SECONDS caps
#                                                 the sweep, default 200)
# Wheels brought along in .whlmin/ are installed to /tmp/site when optuna is missing.
set -uo pipefail
out=${1:-results/fp8-grouped}
mkdir -p "$out"
if ! python3 -c "import optuna, sqlalchemy, alembic" 2>/dev/null && compgen -G ".whlmin/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whlmin/*.whl || exit
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$out/gpu.txt"
python3 - <<'PY' 2>&1 | tee -a "$out/gpu.txt"
import torch, torch.nn.functional as F
print("torch", torch.__version__, "cuda", torch.version.cuda)
S, dev = getattr(F, "ScalingType", None), "cuda"
a = torch.zeros(256, 256, dtype=torch.float8_e4m3fn, device=dev)
w = torch.zeros(2, 256, 256, dtype=torch.float8_e4m3fn, device=dev)
offs = torch.tensor([128, 256], dtype=torch.int32, device=dev)
try:
    F.scaled_grouped_mm(a, w.transpose(-2, -1), torch.ones(256, 2, device=dev), S.BlockWise1x128,
                        torch.ones(2, 2, 2, device=dev), S.BlockWise128x128, offs=offs)
    print("F.scaled_grouped_mm block-wise (1x128, 128x128): runs here")
except Exception as err:  # the claim to check: SM90 takes row-wise scales only
    print("F.scaled_grouped_mm block-wise (1x128, 128x128): refused:", type(err).__name__,
          (str(err).strip().splitlines() or [""])[0][:200])
PY
start=$SECONDS
python3 -m pytest tests/runtime/test_grouped_fp8_gpu.py -m gpu -p no:cacheprovider -q -s > "$out/tests.txt" 2>&1
echo "GPU tests rc=$? in $((SECONDS - start)) s"; grep -E "relative error|swept:|passed|failed|Error" "$out/tests.txt" | tail -12
start=$SECONDS
rm -f "$out/store.sqlite"
# Capped so that the whole call stays under 6 minutes; a sweep stopped there reports what it measured.
timeout -k 20 "${FP8G_SWEEP_SECONDS:-200}" python3 -m cutlass_tune.cli sweep benchmarks/configs/moe_fp8_blockwise.yaml --strategy optuna \
  --trials 6 --batch 6 --storage "$out/store.sqlite" > "$out/sweep.txt" 2>&1
echo "sweep rc=$? in $((SECONDS - start)) s (compile included)"; tail -3 "$out/sweep.txt"
python3 benchmarks/moe_fp8_ratios.py "$out/store.sqlite" | tee "$out/ratios.md"
