"""`cutlass-tune bench`: measure every valid config of a space file on one GPU."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import typer
from rich.table import Table

from .. import compile as compile_stage  # called through the module: a test's patch reaches here
from ..errors import CutlassTuneError
from ..measurement import TimingMethod, TimingScheme, write_jsonl
from ..space import load_space
from ..status import Status
from ._console import out, progress
from ._options import CACHE_DIR, CONFIG, GPU, JOBS, check_output, user_output
from ._timing import BENCH_METHOD, BENCH_PAIRED, timing_options


def bench(
    config: Path = CONFIG,
    gpu: int = GPU,
    repeat: int = typer.Option(1, "--repeat", min=1, help="measure everything N times in this run"),
    output: Path | None = typer.Option(
        None, "--output", "-o", callback=user_output,
        help="JSON lines file (default results/bench-<timestamp>.jsonl)"),
    jobs: int | None = JOBS,
    cache_dir: Path | None = CACHE_DIR,
    method: TimingMethod = BENCH_METHOD,
    paired: bool = BENCH_PAIRED,
) -> None:
    """Compile the valid configs, then measure every (kernel, problem, run-time variant) and
    cuBLAS on one GPU, each checked against an fp32 reference first."""
    # torch, with the GPU stage: only the commands that measure import it.
    from ..bench import plan_jobs, require_gpu

    sp = load_space(config)
    if output is not None:
        check_output(output)
    require_gpu(gpu)
    configs = list(sp.valid)
    if not configs:
        raise CutlassTuneError(f"{config}: no valid config to measure (see `cutlass-tune space {config} --list`)")
    output = output or Path("results") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    output.parent.mkdir(parents=True, exist_ok=True)
    with progress("compiling", len(configs)) as advance:
        kernels = compile_stage.compile_kernels(configs, cache=compile_stage.KernelCache.at(cache_dir), jobs=jobs,
                                                on_result=advance)
    timing = timing_options(method, paired)
    plan = plan_jobs(kernels, sp.problems, sp.runtime_variants, timing=timing, repeat=repeat)
    results = _measure(plan, gpu, output)
    _summarize(results, timing.scheme, repeat, output)


def _measure(plan, gpu: int, output: Path) -> list:
    """Run `plan` on GPU `gpu`, appending each measurement to `output`; print them as a table."""
    from ..bench import baseline_ratio, run_plan  # torch, with the GPU stage

    table = Table("problem", "kernel", "runtime", "status", "median ms", "TFLOP/s", "vs cuBLAS",
                  box=None, pad_edge=False)
    baselines, results = {}, []
    with open(output, "a") as sink, progress("measuring", plan.size) as advance:
        for m in run_plan(plan, device=gpu):
            write_jsonl(sink, m)
            results.append(m)
            advance()
            if m.is_baseline:
                baselines[(m.problem, m.repeat)] = m
            ratio = baseline_ratio(m, baselines)
            table.add_row(
                m.problem.name, m.kernel_name, "" if m.is_baseline else m.runtime.name,
                m.status.value if m.status is Status.OK else f"{m.status.value}: {m.reason}",
                f"{m.median_ms:.4f}" if m.median_ms else "", f"{m.tflops:.1f}" if m.tflops else "",
                f"{ratio:.3f}" if ratio else "",
            )
    out.print(table)
    return results


def _summarize(results: list, scheme: TimingScheme, repeat: int, output: Path) -> None:
    """The host and timing, throttling, run-to-run spread and failures of a bench run; exit 1
    when a measurement failed."""
    from ..bench import repeat_spread  # torch, with the GPU stage

    env = next((m.env for m in results if m.env), None)
    if env:
        out.print(f"{env.gpu} ({env.sm_count} SMs), driver {env.driver}, CUDA {env.cuda_runtime}, "
                  f"torch {env.torch}, nvcc {env.nvcc}, CUTLASS {env.cutlass}; timing: {scheme}")
    throttled = sum(m.throttled for m in results)
    if throttled:
        out.print(f"{throttled} measurements ran while the GPU was throttled (see clocks in the output)")
    if repeat > 1:
        spread = repeat_spread(results)
        if spread:
            spread.sort()
            out.print(f"run-to-run: {len(spread)} measured in every pass; median spread "
                      f"{spread[len(spread) // 2]:.1%}, largest {spread[-1]:.1%}")
    failed = collections.Counter(m.status.value for m in results
                                 if m.status not in (Status.OK, Status.CANNOT_IMPLEMENT, Status.UNSTABLE))
    unstable = sum(m.status is Status.UNSTABLE for m in results)
    out.print(f"{len(results)} measurements written to {output}"
              + (f"; failed: {dict(failed)}" if failed else "")
              + (f"; {unstable} too noisy to rank twice (unstable)" if unstable else ""))
    if failed:
        raise typer.Exit(1)
