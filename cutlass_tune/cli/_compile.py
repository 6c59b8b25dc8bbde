"""`cutlass-tune compile`: build the valid configs of a space file into the kernel cache."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from .. import compile as compile_stage  # called through the module: a test's patch reaches here
from ..errors import CutlassTuneError
from ..space import load_space
from ..status import Status
from ._console import names, out, progress
from ._options import CACHE_DIR, CONFIG, JOBS


def compile_(
    config: Path = CONFIG,
    jobs: int | None = JOBS,
    limit: int | None = typer.Option(None, "--limit", min=1, help="compile the first N valid configs"),
    cache_dir: Path | None = CACHE_DIR,
    kernels_per_unit: int | None = typer.Option(
        None, "--kernels-per-unit", min=1, max=8, help="kernels per translation unit (default: automatic)"),
) -> None:
    """Compile the valid configs of a search-space file into the kernel cache (no GPU needed)."""
    sp = load_space(config)
    configs = list(sp.valid)[:limit] if limit else list(sp.valid)
    if not configs:
        raise CutlassTuneError(f"{config}: no valid config to compile (see `cutlass-tune space {config} --list`)")
    toolchain = compile_stage.find_toolchain()
    cache = compile_stage.KernelCache.at(cache_dir)
    jobs = jobs or compile_stage.default_jobs()
    out.print(f"{len(configs)} configs, {jobs} jobs, nvcc {toolchain.nvcc_version}, "
              f"CUTLASS {toolchain.cutlass_version}, cache {cache.root}")
    start = time.monotonic()
    with progress("compiling", len(configs), starting=f"nvcc on {names(configs)}") as advance:
        results = compile_stage.compile_kernels(configs, cache=cache, toolchain=toolchain, jobs=jobs,
                                                kernels_per_unit=kernels_per_unit, on_result=advance)
    wall = time.monotonic() - start
    built = [r for r in results if r.status is Status.OK and not r.cached]
    cached = [r for r in results if r.status is Status.OK and r.cached]
    failed = [r for r in results if r.status is not Status.OK]
    for r in failed:
        out.print(f"FAILED {r.config.name} ({r.status.value}): {r.reason}\n"
                  f"  source: {r.source_path}\n  log: {r.log_path}")
    for r in results:
        if r.status is Status.OK and r.reason:
            out.print(f"warning {r.config.name}: {r.reason}")
    rate = len(built) / wall * 60 if built else 0.0
    out.print(f"compiled {len(built)}, cached {len(cached)}, failed {len(failed)} in {wall:.1f} s"
              + (f" ({rate:.1f} kernels/min)" if built else ""))
    if failed:
        raise typer.Exit(1)
