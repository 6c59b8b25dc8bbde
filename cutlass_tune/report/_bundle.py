"""Bundles: a best-config table with its compiled kernels, pinned, for hosts that run the tuned
`matmul` without nvcc or the CUTLASS headers (a serving fleet, a container image).

A bundle is a directory:

| file | what it holds |
|---|---|
| `best.json` | the table (`load_best`'s schema), as `cutlass-tune best --format json` writes it |
| `kernels/<unit>.so` | the compiled units holding the table's kernels, copied from the kernel cache |
| `manifest.json` | format, ABI version, toolchain, and for each kernel (by config hash) its library, symbol and the library's SHA-256 |

`read_bundle` checks the manifest against the files before anything is loaded: a library
changed or missing after export, a table row without its kernel, or another ABI version is a
one-line `BundleError`. The kernels are sm90a binaries: they run on Hopper GPUs only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import pandas as pd

from .. import render
from ..errors import CutlassTuneError
from ..status import Status

if TYPE_CHECKING:
    from ..compile import CompiledKernel

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"
TABLE = "best.json"


class BundleError(CutlassTuneError):
    """A bundle cannot be written or read."""


@dataclasses.dataclass(frozen=True)
class BundledKernel:
    """Where a kernel of a bundle lives: a shared object and the prefix of its entry points."""

    library: Path
    symbol: str


@dataclasses.dataclass(frozen=True)
class BundleSummary:
    path: Path
    problems: int
    kernels: int
    libraries: int
    bytes: int


def is_bundle(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / MANIFEST).is_file()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_bundle(frame: pd.DataFrame, compiled: Sequence[CompiledKernel], out: Path,
                 built_with: Mapping[str, str]) -> BundleSummary:
    """Write `frame` and the libraries of its kernels (`compiled`: at least one per config
    hash of the table) to the new directory `out`, all at once: it appears complete or not at
    all.

    Args:
        built_with: toolchain facts for the manifest (nvcc and CUTLASS versions).

    Raises:
        BundleError: `out` exists, or a kernel of the table is missing from `compiled` or did
            not compile.
    """
    from ._table_file import write_table

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
        file = f"{kernel.library.parent.name}.so"  # the unit's key: one copy per unit
        sources[file] = kernel.library
        kernels[config_hash] = {"library": f"kernels/{file}", "symbol": kernel.symbol, "name": name}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "kernels").mkdir(parents=True)
        libraries = {}
        for file, source in sorted(sources.items()):
            shutil.copyfile(source, tmp / "kernels" / file)
            libraries[f"kernels/{file}"] = _sha256(tmp / "kernels" / file)
        write_table(frame, tmp / TABLE, "json")
        manifest = {"format": BUNDLE_FORMAT, "abi_version": render.ABI_VERSION, "arch": "sm90a",
                    "gpus": sorted(set(frame["gpu"])), "built_with": dict(built_with),
                    "libraries": libraries, "kernels": kernels}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum((out / f).stat().st_size for f in libraries)
    return BundleSummary(path=out, problems=len(frame), kernels=len(kernels), libraries=len(libraries), bytes=size)


def read_bundle(path: str | Path) -> tuple[pd.DataFrame, dict[str, BundledKernel]]:
    """The table of the bundle at `path` and its kernels by config hash, after checking every
    library against the manifest.

    Raises:
        BundleError: the manifest is unreadable or of another format or ABI version, a
            library is missing or changed, or a row of the table has no kernel.
    """
    from ._best import load_best

    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        fmt, abi = manifest["format"], manifest["abi_version"]
        libraries, entries = dict(manifest["libraries"]), dict(manifest["kernels"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BundleError(f"{path / MANIFEST} is not a bundle manifest ({type(err).__name__}: {err})") from err
    if fmt != BUNDLE_FORMAT:
        raise BundleError(f"{path} is a bundle of format {fmt}; this cutlass-tune reads format {BUNDLE_FORMAT}")
    if abi != render.ABI_VERSION:
        raise BundleError(f"{path} holds kernels of ABI version {abi}; this cutlass-tune calls version "
                          f"{render.ABI_VERSION}: export the bundle again")
    for file, digest in libraries.items():
        library = path / file
        if Path(file).is_absolute() or ".." in Path(file).parts:
            raise BundleError(f"{path / MANIFEST} names a library outside the bundle: {file}")
        if not library.is_file():
            raise BundleError(f"{library} is missing from the bundle")
        if _sha256(library) != digest:
            raise BundleError(f"{library} differs from the one exported (its SHA-256 does not match the manifest)")
    kernels = {}
    for config_hash, entry in entries.items():
        if entry.get("library") not in libraries:
            raise BundleError(f"{path / MANIFEST}: kernel {config_hash} names no library of the bundle")
        kernels[config_hash] = BundledKernel(library=path / entry["library"], symbol=str(entry["symbol"]))
    frame = load_best(path / TABLE)
    missing = sorted(set(frame["config_hash"]) - set(kernels))
    if missing:
        raise BundleError(f"{path}: the table's kernel {missing[0]} is not in the bundle")
    return frame, kernels
