"""`cutlass-tune native`: the operators' native library for this torch: where it is, whether it
loads, and (`--build`) building it."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import CutlassTuneError
from ..kernel._native import NativeBuild, TorchABI, find_native, native_key
from ._console import out
from ._options import CACHE_DIR


def native(
    build: bool = typer.Option(False, "--build", help="build it now where it is not built (or its build failed)"),
    cache_dir: Path | None = CACHE_DIR,
) -> None:
    """The C++ operators (torch.ops.cutlass_tune.mm, .linear, .grouped_mm with no Python per call)
    for the installed torch: its cache key, where the library is and whether it loads, one fact a
    line. Without a built library the operators run their Python path."""
    import os

    if cache_dir is not None:
        os.environ["CUTLASS_TUNE_CACHE_DIR"] = str(cache_dir)  # the runtime finds it where it was built
    from ..compile import KernelCache
    from ..compile._native import NativeBuildError, build_native, native_dir

    abi = TorchABI.current()
    cache = KernelCache.at(cache_dir)
    key = native_key(abi=abi)
    out.print(f"torch: {abi.torch_version} (C++11 ABI {int(abi.cxx11_abi)}, CUDA {abi.cuda or 'none'}, "
              f"Python {abi.python_abi})")
    out.print(f"key: {key}")
    found: NativeBuild | None
    if build:
        try:
            found = build_native(cache=cache, retry=True)
        except NativeBuildError as err:
            raise CutlassTuneError(f"cannot build the native library: {err}") from err
        out.print(f"built in {found.seconds:.0f} s" if found.library is not None and not found.cached
                  else "built before" if found.library is not None else "build: failed")
    else:
        found = find_native(key, native_dir(cache))
    if found is None:
        out.print("library: not built (cutlass-tune native --build)")
        return
    if found.library is None:
        out.print(f"library: none: {found.reason}")
        raise typer.Exit(1)
    out.print(f"library: {found.library}")
    from ..runtime import _native, _op  # _op defines the operators: from the library where it loads

    del _op

    if _native.available():
        out.print(f"loads: yes (CUDA kernels {'in C++' if _native.cuda() else 'none: a CPU torch'})")
    else:
        out.print(f"loads: no: {_native.reason()}")
        raise typer.Exit(1)
