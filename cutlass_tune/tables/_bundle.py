"""Bundles: a best-config table with its compiled kernels, pinned, for hosts that run the tuned
`matmul` without nvcc or the CUTLASS headers (a serving fleet, a container image).

A bundle is a directory:

| file | what it holds |
|---|---|
| `best.json` | the table (`load_best`'s schema), as `cutlass-tune best --format json` writes it |
| `kernels/<unit>.so` | the compiled units holding the table's kernels, copied from the kernel cache |
| `manifest.json` | format, ABI version, toolchain; per kernel (config hash): library, symbol, SHA-256 |

`read_bundle` checks the manifest against the files before anything is loaded: a library
changed or missing after export, a table row without its kernel or whose config hash is not
its config's, or another ABI version is a one-line `BundleError`. The kernels are sm90a
binaries: they run on Hopper GPUs only.
(`cutlass-tune export` writes bundles: report/_export.py.)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from .._files import read_input, sha256_of
from ..errors import CutlassTuneError
from ..kernel import ABI_VERSION
from ..space import KernelConfig
from ._file import read_table

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


def is_bundle(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / MANIFEST).is_file()


def read_bundle(path: str | Path) -> tuple[pd.DataFrame, dict[str, BundledKernel]]:
    """The table of the bundle at `path` and its kernels by config hash, after checking every
    library against the manifest.

    Raises:
        BundleError: the manifest is unreadable or of another format or ABI version, a
            library is missing or changed, or a row of the table has no kernel or names another
            config's.
        BestTableError: the bundle's table file, as `read_table` raises it.
    """
    path = Path(path)
    try:
        manifest = json.loads(read_input(path / MANIFEST).decode("utf-8"))
        fmt, abi = manifest["format"], manifest["abi_version"]
        libraries, entries = dict(manifest["libraries"]), dict(manifest["kernels"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise BundleError(f"{path / MANIFEST} is not a bundle manifest ({type(err).__name__}: {err})") from err
    if fmt != BUNDLE_FORMAT:
        raise BundleError(f"{path} is a bundle of format {fmt}; this cutlass-tune reads format {BUNDLE_FORMAT}")
    if abi != ABI_VERSION:
        raise BundleError(f"{path} holds kernels of ABI version {abi}; this cutlass-tune calls version "
                          f"{ABI_VERSION}: export the bundle again")
    for file, digest in libraries.items():
        if not isinstance(file, str) or not isinstance(digest, str):
            raise BundleError(f"{path / MANIFEST}: library entry {str(file)[:60]!r} is not a file name with its "
                              f"SHA-256 (found {type(digest).__name__})")
        library = path / file
        if Path(file).is_absolute() or ".." in Path(file).parts:
            raise BundleError(f"{path / MANIFEST} names a library outside the bundle: {file}")
        if not library.is_file():
            raise BundleError(f"{library} is missing from the bundle")
        try:
            digest_found = sha256_of(library)
        except OSError as err:  # no permission to read it
            raise BundleError(f"cannot read {library}: {err.strerror or err}") from err
        if digest_found != digest:
            raise BundleError(f"{library} differs from the one exported (its SHA-256 does not match the manifest)")
    kernels = {}
    for config_hash, entry in entries.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("symbol"), str):
            raise BundleError(f"{path / MANIFEST}: kernel {str(config_hash)[:40]} is {type(entry).__name__}, not an "
                              "object with its library and symbol")
        if not isinstance(entry.get("library"), str) or entry["library"] not in libraries:
            raise BundleError(f"{path / MANIFEST}: kernel {config_hash} names no library of the bundle")
        kernels[config_hash] = BundledKernel(library=path / entry["library"], symbol=str(entry["symbol"]))
    frame = read_table(path / TABLE)
    missing = sorted(set(frame["config_hash"]) - set(kernels))
    if missing:
        raise BundleError(f"{path}: the table's kernel {missing[0]} is not in the bundle")
    for number, (config_hash, text) in enumerate(zip(frame["config_hash"], frame["config"]), 1):
        # matmul runs the kernel the hash names as the row's config says (Stream-K's workspace,
        # the output's dtype, the layout): the two must be one kernel.
        own = KernelConfig.from_dict(json.loads(text)).hash
        if config_hash != own:
            raise BundleError(f"{path / TABLE}: row {number}: config_hash {config_hash} is not its config's {own}: "
                              "the bundled kernel it names was built from another config")
    return frame, kernels


def read_local(path: str | Path) -> tuple[pd.DataFrame, dict[str, BundledKernel]]:
    """The table in a bundle directory (with its kernels by config hash) or in a table file
    (with none).

    Raises:
        BestTableError: what `read_table` raises for the table file.
        BundleError: what `read_bundle` raises for the bundle.
    """
    if is_bundle(path):
        return read_bundle(path)
    return read_table(Path(path)), {}
