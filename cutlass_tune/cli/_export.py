"""`cutlass-tune export`: the best kernels of a store as a bundle for serving hosts."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .. import __version__, settings
from .. import compile as compile_stage  # called through the module: a test's patch reaches here
from ..errors import CutlassTuneError
from ..report import load_best, write_bundle
from ..space import KernelConfig
from ..store import resolve_storage
from ._console import names, out, outcome, progress
from ._options import CACHE_DIR, JOBS, READ_DEFAULT, check_output, user_output


def export(
    storage: str | None = typer.Option(
        None, "--storage", help=f"store URL, .sqlite file, best-config table or bundle ({READ_DEFAULT})"),
    output: Path = typer.Option(..., "--output", "-o", callback=user_output,
        help="the bundle: a directory that does not exist yet"),
    gpu_name: str | None = typer.Option(None, "--gpu-name", help="keep only the rows of this GPU model"),
    jobs: int | None = JOBS,
    cache_dir: Path | None = CACHE_DIR,
    native: bool = typer.Option(True, "--native/--no-native",
                                help="carry the operators' native library for this host's torch (built if need be)"),
) -> None:
    """Pin the best kernel of every problem for shipping: one directory with the table and the
    compiled kernels, which `BestTable.load(DIR)` and `matmul` use with no nvcc or CUTLASS."""
    if output.exists():
        raise CutlassTuneError(f"{output} exists: remove it or export to a new directory")
    check_output(output)
    frame = load_best(resolve_storage(storage))
    if gpu_name is not None:
        frame = frame[frame["gpu"] == gpu_name].reset_index(drop=True)
        if frame.empty:
            raise CutlassTuneError(f"--gpu-name {gpu_name!r}: the table has no row for it")
    configs = list({h: KernelConfig.from_dict(json.loads(c))
                    for h, c in zip(frame["config_hash"], frame["config"])}.values())
    toolchain = compile_stage.find_toolchain()
    with progress("compiling", len(configs), outcome, starting=f"nvcc on {names(configs)}") as advance:
        compiled = compile_stage.compile_kernels(configs, cache=compile_stage.KernelCache.at(cache_dir),
                                                 toolchain=toolchain, jobs=jobs or compile_stage.default_jobs(),
                                                 on_result=advance)
    native_build, native_note = _native_build(cache_dir) if native else (None, "")
    with progress("bundling", len(configs), str) as advance:
        summary = write_bundle(frame, compiled, output, {"nvcc": toolchain.nvcc_version,
                                                         "cutlass": toolchain.cutlass_version,
                                                         "cutlass_tune": __version__}, on_kernel=advance,
                               native=[] if native_build is None else [native_build])
    out.print(f"exported {summary.problems} problems, {summary.kernels} kernels in {summary.libraries} "
              f"libraries ({summary.bytes / 1e6:.1f} MB) to {summary.path}; "
              f"load it with cutlass_tune.BestTable.load({str(summary.path)!r})")
    if native_note:
        out.print(native_note)


def _native_build(cache_dir: Path | None) -> tuple[Path | None, str]:
    """The operators' native library for this host's torch, built if need be, for the bundle
    (its folder in the kernel cache), and the line that says so; None and why where it cannot be
    built or is disabled (CUTLASS_TUNE_NATIVE=0: nothing said)."""
    if not settings.native_enabled():
        return None, ""
    try:
        from ..compile._native import build_native

        found = build_native(cache=compile_stage.KernelCache.at(cache_dir))
    except (CutlassTuneError, ImportError, OSError) as err:
        return None, f"the bundle carries no native operators: {err}"
    if found.library is None:
        return None, f"the bundle carries no native operators: {(found.reason.splitlines() or [''])[0]}"
    return found.library.parent, f"it carries the native operators built for this torch (key {found.key[:12]})"
