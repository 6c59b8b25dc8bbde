"""Which kernel torch's own path launches for each benchmark problem (device only).

    python3 benchmarks/cublas_kernels.py > cublas_kernels.md
    python3 benchmarks/cublas_kernels.py benchmarks/configs/llama3_70b_tp8_bf16.yaml   # a space's problems

Runs each problem's baseline (`CublasTarget`: torch.matmul, or torch._scaled_mm for fp8, both
accumulations) under torch.profiler and prints the GPU kernels it launched, with their mean
duration. cuBLAS's kernel names carry its tile and cluster shape (e.g.
`nvjet_sm90_tst_320x128_64x3_1x2_...`), which says what the CUTLASS space is up against.
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from cutlass_tune.bench._runner import CublasTarget
from cutlass_tune.bench._verify import allocate, randomize
from cutlass_tune.space import DType, Problem, RuntimeArgs, load_space

SQUARES = (128, 256, 512, 1024, 2048, 4096, 6144, 8192)
CASES = (
    [(Problem(s, s, s), False) for s in SQUARES]
    + [(Problem(s, s, s, dtype_a=DType.F16, dtype_b=DType.F16, dtype_d=DType.F16), False) for s in (1024, 2048, 4096)]
    + [(Problem(s, s, s, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16), fast)
       for s in (1024, 2048, 4096, 8192) for fast in (False, True)]
)


def kernels_of(problem: Problem, fast_accum: bool) -> list[tuple[str, float]]:
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    target = CublasTarget(problem, fast_accum=fast_accum)
    why = target.setup(RuntimeArgs(), ops)
    if why:
        return [(f"(not run: {why})", 0.0)]
    for _ in range(10):  # heuristics cache, module loading
        target.launch()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            target.launch()
        torch.cuda.synchronize()
    return [(e.key, e.device_time / 1000.0) for e in prof.key_averages() if e.device_time > 0]


def main() -> None:
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}\n")
    cases = [(p, False) for path in sys.argv[1:] for p in load_space(path).problems] or CASES
    print("| problem | baseline | kernel | mean ms |")
    print("|---|---|---|---|")
    for problem, fast in cases:
        base = ("_scaled_mm" + (" fast accum" if fast else "")) if problem.dtype_a.is_fp8 else "matmul"
        for name, ms in kernels_of(problem, fast):
            print(f"| {problem.name} | {base} | `{name[:110]}` | {ms:.4f} |", flush=True)


if __name__ == "__main__":
    main()
