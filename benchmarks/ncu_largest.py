"""What limits the largest GEMMs: one launch each of the best CUTLASS kernels found at 8192^3
and of cuBLAS, for Nsight Compute to profile (device only).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --csv --page details python3 benchmarks/ncu_largest.py

Only the launches between cudaProfilerStart and cudaProfilerStop are profiled: for each kernel,
then cuBLAS, one launch on L2-cold operands. `--clock-control none` keeps the board's own
(power-limited) clocks instead of ncu's locked base clock.
"""

from __future__ import annotations

import torch

from cutlass_tune import settings
from cutlass_tune.bench._loader import LoadedKernel, make_args
from cutlass_tune.bench._timing import L2Flush
from cutlass_tune.bench._verify import allocate, randomize
from cutlass_tune.compile import KernelCache, compile_kernels
from cutlass_tune.space import EpilogueSchedule, KernelConfig, KernelSchedule, Problem, RasterOrder, RuntimeArgs

SIZE = 8192
KERNELS = (  # the paired sweeps' winner at 8192^3, and CUTLASS's usual large-tile choice
    (KernelConfig(tile_m=128, tile_n=192, cluster_m=2, kernel_schedule=KernelSchedule.PINGPONG,
                  epilogue_schedule=EpilogueSchedule.TMA), RuntimeArgs(raster=RasterOrder.ALONG_N, swizzle=1)),
    (KernelConfig(tile_m=128, tile_n=256, cluster_n=2), RuntimeArgs(raster=RasterOrder.ALONG_M, swizzle=4)),
)


def main() -> None:
    problem = Problem(SIZE, SIZE, SIZE)
    built = compile_kernels([c for c, _ in KERNELS], cache=KernelCache(settings.cache_dir()))
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    flush = L2Flush(0, torch.cuda.get_device_properties(0).L2_cache_size)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stream = torch.cuda.current_stream().cuda_stream
    launches = []
    for compiled, (_, runtime) in zip(built, KERNELS):
        kernel = LoadedKernel(compiled.library, compiled.symbol)
        gemm = kernel.create()
        args = make_args(problem, runtime, a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                         device_id=0, sm_count=sms)
        gemm.initialize(args, None, stream)
        launches.append((compiled.config.name, lambda g=gemm: g.run(stream)))
    launches.append(("cuBLAS", lambda: torch.matmul(ops.a, ops.b.t(), out=ops.d)))
    for _, launch in launches:  # warm up: clocks, cuBLAS's heuristics cache, module loading
        for _ in range(20):
            launch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, launch in launches:
        flush()
        launch()
        torch.cuda.synchronize()
        print(f"profiled: {name}", flush=True)
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
