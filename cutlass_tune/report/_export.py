"""What the tuner hands on: best-config tables written to files (`cutlass-tune best -o`) and
bundles (`cutlass-tune export`), in the formats `cutlass_tune.tables` reads.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pandas as pd

from .._files import FileWriteError, write_atomically
from ..compile import intact
from ..errors import first_line
from ..kernel import ABI_VERSION
from ..status import Status
from ..store import local_file
from ..tables import (
    BUNDLE_FORMAT,
    MANIFEST,
    TABLE,
    BestTableError,
    BundleError,
    is_bundle,
    read_bundle,
    sha256_of,
)

if TYPE_CHECKING:
    from ..compile import CompiledKernel


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` (paths, `.sqlite` files or SQLite store URLs, as `load_best` takes
    them) name one existing file, through links too; a bundle directory stands for its table
    file as well. False where either does not exist or is a store on a server.

    `cutlass-tune best --storage SOURCE -o OUTPUT` refuses to write where this holds: the
    output would replace the table, or the store, it was read from."""

    def files(x: str | Path) -> list[Path]:
        path = local_file(x)
        if path is None:
            return []
        return [path, path / TABLE] if is_bundle(path) else [path]

    for x in files(a):
        for y in files(b):
            try:
                if os.path.samefile(x, y):
                    return True
            except (OSError, ValueError):  # one of them does not exist (or is not a valid path)
                continue
    return False


def _cannot_write(path: Path | str, err: OSError) -> BestTableError:
    return BestTableError(f"cannot write {path}: {err.strerror or first_line(err)}")


def write_table(frame: pd.DataFrame, path: str | Path, fmt: str, *, source: str | Path | None = None) -> None:
    """Write `frame` as csv, json or parquet, atomically: to a temporary file beside `path`,
    then renamed over it; on any failure `path` is as it was and the temporary file is gone.

    Args:
        source: where `frame` was read from (as given to `load_best`); writing over it is refused.

    Raises:
        BestTableError: an unknown format, parquet without pyarrow, `path` is `source`, or
            `path` cannot be written (a directory, no such folder, no permission, a full disk):
            one line, "cannot write PATH: <reason>".
    """
    if fmt not in ("csv", "json", "parquet"):
        raise BestTableError(f"unknown format {fmt!r}")
    if not str(path):
        raise BestTableError("cannot write '': no file name given")
    path = Path(path)
    if source is not None and same_file(source, path):
        raise BestTableError(f"cannot write {path}: it is the table's source ({source}); write to another file")
    if path.is_dir() or not path.name:
        raise _cannot_write(path, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
    writers: dict[str, Callable[[IO[Any]], None]] = {
        "csv": lambda f: frame.to_csv(f, index=False),
        "json": lambda f: frame.to_json(f, orient="records", indent=1, double_precision=15),
        "parquet": lambda f: frame.to_parquet(f, index=False)}
    try:
        write_atomically(path, writers[fmt], binary=fmt == "parquet")
    except ImportError as err:
        raise BestTableError("parquet output needs pyarrow (pip install 'cutlass-tune[parquet]')") from err
    except FileWriteError as err:
        raise BestTableError(str(err)) from err


@dataclasses.dataclass(frozen=True)
class BundleSummary:
    """What `write_bundle` wrote: the bundle's directory, its problems, kernels, libraries and their bytes."""

    path: Path
    problems: int
    kernels: int
    libraries: int
    bytes: int


def write_bundle(frame: pd.DataFrame, compiled: Sequence[CompiledKernel], out: Path,
                 built_with: Mapping[str, str], on_kernel: Callable[[str], None] | None = None,
                 native: Sequence[Path] = ()) -> BundleSummary:
    """Write `frame` and the libraries of its kernels (`compiled`: at least one per config
    hash of the table) to the new directory `out`, all at once: it appears complete or not at
    all.

    Args:
        built_with: toolchain facts for the manifest (nvcc and CUTLASS versions).
        on_kernel: called with each kernel's name once its library is checked and placed.
        native: builds of the operators' native library (folders `<key>/` of the kernel cache's
            `native/`, one per torch ABI), copied to the bundle's `native/<key>/`, where
            `cutlass_tune.runtime` looks for the one of its torch (checked by its recorded digest).

    Raises:
        BundleError: `out` exists, or a kernel of the table is missing from `compiled` or did
            not compile.
    """
    out = Path(out)
    if out.exists():
        raise BundleError(f"{out} exists: remove it or export to a new directory")
    by_hash = {k.config.hash: k for k in compiled}
    kernels: dict[str, dict[str, str]] = {}
    sources: dict[str, Path] = {}
    for config_hash, name in dict(zip(frame["config_hash"], frame["kernel"])).items():
        kernel = by_hash.get(config_hash)
        if kernel is None:
            raise BundleError(f"{name} ({config_hash}) was not compiled for the bundle")
        if kernel.status is not Status.OK or kernel.library is None:
            raise BundleError(f"{name} does not compile: {kernel.reason}")
        if not intact(kernel.library.parent):
            raise BundleError(f"{name}: the cached library {kernel.library} is damaged (not what was built); "
                              "run `cutlass-tune compile` again to rebuild it")
        file = f"{kernel.library.parent.name}.so"  # the unit's key: one copy per unit
        sources[file] = kernel.library
        kernels[config_hash] = {"library": f"kernels/{file}", "symbol": kernel.symbol, "name": name}
        if on_kernel is not None:
            on_kernel(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "kernels").mkdir(parents=True)
        libraries = {}
        for file, source in sorted(sources.items()):
            shutil.copyfile(source, tmp / "kernels" / file)
            libraries[f"kernels/{file}"] = sha256_of(tmp / "kernels" / file)
        for build in native:
            shutil.copytree(build, tmp / "native" / build.name, ignore=shutil.ignore_patterns("*.o", "step*.log"))
        write_table(frame, tmp / TABLE, "json")
        manifest = {"format": BUNDLE_FORMAT, "abi_version": ABI_VERSION, "arch": "sm90a",
                    "gpus": sorted(set(frame["gpu"])), "built_with": dict(built_with),
                    "libraries": libraries, "kernels": kernels, "native": sorted(b.name for b in native)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        try:  # never hand on a bundle its own reader refuses
            read_bundle(tmp)
        except (BestTableError, BundleError) as err:
            raise BundleError(f"{out} not written: its reader would refuse it ({first_line(err)})") from err
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum((out / f).stat().st_size for f in libraries)
    return BundleSummary(path=out, problems=len(frame), kernels=len(kernels), libraries=len(libraries), bytes=size)
