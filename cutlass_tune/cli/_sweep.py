"""`cutlass-tune sweep`: search the compile-time knobs on one or several GPUs into a store."""

from __future__ import annotations

import concurrent.futures
import enum
import math
from pathlib import Path

import typer

from .. import compile as compile_stage  # called through the module: a test's patch reaches here
from .._devices import NO_GPU_MESSAGE, surely_no_gpu
from ..errors import CutlassTuneError
from ..measurement import TimingMethod
from ..space import SearchSpace, sweep_space
from ..store import default_store_url, open_store
from ._console import out
from ._options import CACHE_DIR, DTYPE, EPILOGUE, JOBS, LAYOUT, ROUTING, SCALING, SHAPES, SPACE_FILE
from ._sweep_display import sweep_display, sweep_table
from ._timing import SWEEP_METHOD, SWEEP_PAIRED, timing_options


class Sampler(str, enum.Enum):
    """The search's samplers: the names of `search.SAMPLERS`, spelt out here so that the help
    lists them without importing Optuna (a test keeps the two equal)."""

    TPE = "tpe"
    GP = "gp"
    RANDOM = "random"
    GRID = "grid"


class Strategy(str, enum.Enum):
    """The sweep's strategies: the names of `search.STRATEGIES` (a test keeps the two equal)."""

    PRIOR = "prior"
    OPTUNA = "optuna"


def sweep(
    config: Path | None = SPACE_FILE,
    shapes: str | None = SHAPES,
    dtype: str | None = DTYPE,
    layout: str | None = LAYOUT,
    epilogue: str | None = EPILOGUE,
    scaling: str | None = SCALING,
    routing: str | None = ROUTING,
    strategy: Strategy | None = typer.Option(
        None, "--strategy", help="prior: a model of the measurements picks first (default for kernels: auto); "
        "optuna: the sampler after the warm start (default for a file's lists)"),
    trials: int = typer.Option(48, "--trials", min=1, help="most configs compiled and measured in this store"),
    timeout: float | None = typer.Option(None, "--timeout", min=1, help="stop proposing after S seconds"),
    sampler: Sampler = typer.Option(Sampler.TPE, "--sampler", help="how the search proposes configs"),
    storage: str | None = typer.Option(
        None, "--storage", help="store URL or .sqlite file (default: results/sweep-<gpu>.sqlite)"),
    jobs: int | None = JOBS,
    gpu: list[int] = typer.Option([0], "--gpu", min=0, help="CUDA device index; repeat it to measure on "
                                  "several GPUs of one model at once (--gpu 0 --gpu 1)"),
    batch: int | None = typer.Option(None, "--batch", min=1, help="configs compiled per batch (default: jobs)"),
    seed: int = typer.Option(0, "--seed", help="sampler seed"),
    cache_dir: Path | None = CACHE_DIR,
    method: TimingMethod | None = SWEEP_METHOD,
    paired: bool | None = SWEEP_PAIRED,
    race: bool = typer.Option(True, "--race/--no-race", help="time a kernel's run-time variants briefly "
                              "first and fully only those that can still be the problem's best; the rest are "
                              "kept as coarse (not with --method sustained)"),
) -> None:
    """Search the compile-time knobs (led by a prior fitted on measurements, or by Optuna's
    sampler); measure every run-time variant of each kernel on every problem; keep everything
    in the store. Re-running the same command resumes."""
    repeated = sorted({g for g in gpu if gpu.count(g) > 1})
    if repeated:
        raise CutlassTuneError(f"--gpu {repeated[0]} given more than once")
    if timeout is not None and not math.isfinite(timeout):
        raise CutlassTuneError(f"--timeout {timeout}: give a number of seconds")
    sp = sweep_space(config, shapes, dtype, layout, epilogue, scaling, routing)
    if not sp.auto and not sp.valid:  # a file's lists: checked at once, before looking for a GPU
        raise CutlassTuneError(f"{sp.path}: no valid config to tune (see `cutlass-tune space {sp.path} --list`)")
    # A bad --storage fails here, before any GPU work; a new store is made by its first write.
    store = open_store(storage, new=True) if storage is not None else None
    if surely_no_gpu():  # before torch's import and the walk of kernels: auto (seconds each)
        raise CutlassTuneError(NO_GPU_MESSAGE)
    if not sp.valid:
        raise CutlassTuneError(f"{sp.path}: no valid config to tune (see `cutlass-tune space {sp.path} --list`)")
    # torch and optuna, with the GPU and search stages: only the commands that measure import them.
    from ..bench import RaceOptions
    from ..search import SweepSettings, require_one_model

    benches = _start_benchmarkers(gpu)
    try:
        require_one_model(benches)
        if store is None:
            store = open_store(default_store_url(benches[0].gpu_name), new=True)
        timing = timing_options(method, paired, store.timing())
        for b in benches:
            b.timing = timing
            b.race = RaceOptions() if race else None
        store.bind_gpu(benches[0].gpu_name)
        store.bind_timing(benches[0].scheme)
        jobs = jobs or compile_stage.default_jobs()
        _announce(sp, store, benches, gpu, strategy, sampler, trials)
        settings = SweepSettings(trials=trials, timeout_s=timeout, sampler=sampler.value, batch=batch or jobs,
                                 seed=seed, strategy=strategy and strategy.value)
        _run(sp, store, benches, settings, compile_stage.KernelCache.at(cache_dir), jobs)
    finally:
        for b in benches:
            b.close()


def _announce(sp: SearchSpace, store, benches: list, gpu: list[int], strategy: Strategy | None, sampler: Sampler,
              trials: int) -> None:
    """The sweep's first line: its space, GPUs, store and timing, and how it searches."""
    bench = benches[0]
    gpus = (f"{len(benches)} x {bench.gpu_name} (GPUs {', '.join(map(str, gpu))})" if len(benches) > 1
            else bench.gpu_name)
    out.print(f"{sp.path}: {len(sp.problems)} problems, {len(sp.valid)} valid configs; "
              f"{gpus}; store {store.shown} ({bench.scheme}); "
              f"{f'strategy {strategy.value}, ' if strategy else ''}sampler {sampler.value}, "
              f"up to {trials} compiled configs")


def _run(sp: SearchSpace, store, benches: list, settings, cache, jobs: int) -> None:
    """Run the sweep with its progress shown, then print how it ended."""
    from ..search import Sweep  # optuna, with the search stage

    def compile_batch(configs):
        return compile_stage.compile_kernels(configs, cache=cache, jobs=jobs)

    display, show = sweep_display(out)
    with display:
        state = Sweep(sp, store, store.url, compile_batch, benches, settings, on_update=show).run()
    if not out.is_terminal:
        out.print(sweep_table(state))
    for reason in state.lost:
        out.print(f"given up mid-sweep: {reason}; the other GPUs measured what it left")
    shared = (f"; {state.elsewhere} of its proposals left to another sweep on the store, which was "
              "measuring them" if state.elsewhere else "")
    out.print(f"stopped: {state.stop_reason}; run {state.run_id}{shared}")


def _start_benchmarkers(devices: list[int]) -> list:
    """One benchmark worker per GPU, started in parallel (each imports torch and opens a
    context: seconds). Closes those that started if another fails."""
    from ..bench import WorkerBenchmarker  # torch, with the GPU stage

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
        futures = [pool.submit(WorkerBenchmarker, d) for d in devices]
    started, error = [], None
    for f in futures:
        try:
            started.append(f.result())
        except Exception as exc:  # the first error is reported, after the others are closed
            error = error or exc
    if error is not None:
        for b in started:
            b.close()
        raise error
    return started
