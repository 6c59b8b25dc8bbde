"""What re-arming a Stream-K kernel costs per call, against cuBLAS, in one run.

A Stream-K kernel's barrier counters grow with each launch, so its workspace must be zeroed
before every launch. The sweep times the launch alone (the zeroing enqueued just before the
opening event); a caller pays the zeroing too. For each Stream-K winner of the given stores,
three timings, each paired with torch.matmul by the sweep's method (L2-cold CUDA events,
median): the launch alone (what the sweep ranks), the sweep's own zeroing (the whole
workspace, by torch) and the launch inside the interval, and CUTLASS's `initialize` (host-side
parameters, then the barrier part of the workspace zeroed) and the launch inside the interval
(what `matmul` does before each Stream-K call).

    python3 benchmarks/streamk_rearm_probe.py results/llama3-8b-nvidia-h200.sqlite ...
"""

from __future__ import annotations

import argparse

import torch

from cutlass_tune import BestTable
from cutlass_tune.bench import L2Flush, TimingOptions, time_paired
from cutlass_tune.bench._runner import CublasTarget, CutlassTarget, _stream
from cutlass_tune.bench._verify import allocate, compare, randomize, reference
from cutlass_tune.compile import compile_kernels
from cutlass_tune.kernel import LoadedKernel, make_args
from cutlass_tune.space import Problem, TileScheduler


def main(sources: list[str]) -> None:
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    flush = L2Flush(device, props.L2_cache_size)
    options = TimingOptions(paired=True)
    print(f"{props.name}; torch {torch.__version__}; L2-cold CUDA events, paired with torch.matmul, median")
    print("| problem | workspace MB | launch alone | + torch zero_ | + CUTLASS initialize | rel. error | kernel |")
    print("|---|---|---|---|---|---|---|")
    winners = []
    for source in sources:
        table = BestTable.load(source)
        for row in table.frame.itertuples():
            if row.tile_scheduler == TileScheduler.STREAM_K.value:
                winners.append((row, table.lookup(row.m, row.n, row.k, row.dtype_a, row.layout)))
    configs = list({match.config.hash: match.config for _, match in winners}.values())
    built = {k.config.hash: k for k in compile_kernels(configs)}
    for row, match in winners:
        compiled = built[match.config.hash]
        kernel = LoadedKernel(compiled.library, compiled.symbol)
        problem = Problem(row.m, row.n, row.k)
        ops = allocate(problem, f"cuda:{device}")
        randomize(ops, torch.Generator(device=f"cuda:{device}").manual_seed(0))
        target = CutlassTarget(kernel, device, props.multi_processor_count)
        why = target.setup(match.runtime, ops)
        if why:
            print(f"| {row.problem} | - | {why} | | | | {row.kernel} |")
            continue
        gemm, workspace = target._gemm, target._workspace
        args = make_args(problem, match.runtime, a=ops.a.data_ptr(), b=ops.b.data_ptr(), d=ops.d.data_ptr(),
                         device_id=device, sm_count=props.multi_processor_count)

        def initialize_and_launch() -> None:
            gemm.initialize(args, workspace.data_ptr() if workspace is not None else None, _stream())
            target.launch()

        def zero_and_launch() -> None:
            if target.rearm is not None:  # None: this variant needs no workspace (no tile is split)
                target.rearm()
            target.launch()

        ops.d.fill_(float("nan"))
        initialize_and_launch()
        torch.cuda.synchronize()
        error = compare(ops.d, reference(ops), problem.dtype_d).rel_error
        cublas = CublasTarget(problem)
        cublas.setup(None, ops)
        ratios = []
        for launch, prepare in ((target.launch, target.rearm), (zero_and_launch, None),
                                (initialize_and_launch, None)):
            mine, theirs = time_paired(launch, cublas.launch, options=options, flush=flush, prepare=prepare)
            ratios.append(f"{theirs.median_ms / mine.median_ms:.3f} ({mine.median_ms * 1e3:.1f} us)")
        size = workspace.numel() / 1e6 if workspace is not None else 0.0
        print(f"| {row.problem} | {size:.1f} | {' | '.join(ratios)} | {error:.1e} | "
              f"{row.kernel} {row.runtime} |", flush=True)
        target.close()
        cublas.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="stores or best-config tables")
    main(parser.parse_args().sources)
