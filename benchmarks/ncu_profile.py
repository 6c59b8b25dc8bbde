"""One launch each of chosen CUTLASS kernels and of cuBLAS at a square size, for Nsight Compute
to profile (device only). 8192^3: what limits the largest GEMMs; 2048^3: where cuBLAS's lead
at that size sits.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --csv --page details python3 benchmarks/ncu_profile.py [SIZE [ROUNDS]]

ROUNDS > 1 profiles every launch ROUNDS times, in a rotated order each round
(`benchmarks/ncu_cycles.py` takes medians over the rounds).

Only the launches between cudaProfilerStart and cudaProfilerStop are profiled: for each kernel,
then cuBLAS, one launch on L2-cold operands. `--clock-control none` keeps the board's own
(power-limited) clocks instead of ncu's locked base clock.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from cutlass_tune import settings
from cutlass_tune.bench._timing import L2Flush
from cutlass_tune.bench._verify import Operands, allocate, randomize
from cutlass_tune.compile import KernelCache, compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import EpilogueSchedule, KernelConfig, KernelSchedule, Problem, RasterOrder, RuntimeArgs

_PINGPONG = dict(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=EpilogueSchedule.TMA)
KERNELS = {
    # the paired sweeps' winner at 8192^3, and CUTLASS's usual large-tile choice
    8192: ((KernelConfig(tile_m=128, tile_n=192, cluster_m=2, **_PINGPONG),
            RuntimeArgs(raster=RasterOrder.ALONG_N, swizzle=1)),
           (KernelConfig(tile_m=128, tile_n=256, cluster_n=2), RuntimeArgs(raster=RasterOrder.ALONG_M, swizzle=4))),
    # the sweeps' winner at 2048^3 (256 tiles: 1.94 per SM) with each cluster shape (TMA
    # multicast), and cuBLAS's own tile and cluster there (256x128 cooperative 1x2: 128 tiles,
    # one per SM), all sourceless
    2048: tuple((KernelConfig(tile_m=128, tile_n=128, cluster_m=cm, cluster_n=cn, epilogue_source=False,
                              **_PINGPONG), RuntimeArgs(raster=RasterOrder.ALONG_M, swizzle=8))
                for cm, cn in ((1, 1), (1, 2), (2, 1), (2, 2))) + (
           (KernelConfig(tile_m=256, tile_n=128, cluster_n=2, epilogue_source=False),
            RuntimeArgs(raster=RasterOrder.ALONG_M, swizzle=1)),),
}


def build_launches(size: int) -> tuple[Operands, list[tuple[str, Callable[[], None]]]]:
    """The operands of the square problem `size` and one launch per kernel of KERNELS[size]
    (compiled through the cache, prepared), cuBLAS last."""
    problem = Problem(size, size, size)
    chosen = KERNELS[size]
    built = compile_kernels([c for c, _ in chosen], cache=KernelCache(settings.cache_dir()))
    ops = allocate(problem, "cuda:0")
    randomize(ops, torch.Generator("cuda:0").manual_seed(0))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stream = torch.cuda.current_stream().cuda_stream
    launches = []
    for compiled, (_, runtime) in zip(built, chosen):
        kernel = LoadedKernel(compiled.library, compiled.symbol)
        gemm = kernel.create()
        args = make_args(problem, runtime, a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                         device_id=0, sm_count=sms)
        gemm.initialize(args, None, stream)
        launches.append((compiled.config.name,  # the stream read at launch time, as graph capture needs
                         lambda g=gemm: g.run(torch.cuda.current_stream().cuda_stream)))
    launches.append(("cuBLAS", lambda: torch.matmul(ops.a, ops.b.t(), out=ops.d)))
    return ops, launches


def main(size: int, rounds: int) -> None:
    _, launches = build_launches(size)
    flush = L2Flush(0, torch.cuda.get_device_properties(0).L2_cache_size)
    for _, launch in launches:  # warm up: clocks, cuBLAS's heuristics cache, module loading
        for _ in range(20):
            launch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for r in range(rounds):  # each round in a rotated order: no kernel always follows the same one
        for name, launch in launches[r % len(launches):] + launches[:r % len(launches)]:
            flush()
            launch()
            torch.cuda.synchronize()
            print(f"profiled: {name}", flush=True)
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8192, int(sys.argv[2]) if len(sys.argv) > 2 else 1)
