"""Where the operators' native library lives (`cutlass_tune/native/`, built by the compile
stage's `compile/_native.py`): its cache key for the installed torch and the folder layout of a
build, in the kernel cache (`<cache>/v1/native/`) or in a bundle (`<bundle>/native/`):

    <key>/cutlass_tune_native.so   the extension, with build.log and library.json (size, SHA-256)
    <key>.failed.json              a build that failed: the compiler's first error line
    <key>.failed.log               that build's commands and output

The key hashes the sources (every `*.cpp`, every `*.cu` where torch has CUDA, every `*.h`), the
flags that depend on the ABI, torch's version, its C++ ABI flag, its CUDA version (None on a CPU
torch) and the Python ABI (the extension suffix): another torch or Python finds another key,
never a library built against different headers. Here, below the compiler, so that a serving
host finds and loads a built copy without importing it; torch is imported only by
`TorchABI.current`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

from .. import settings
from .._files import sha256_of, shipped

MODULE = "cutlass_tune_native"
"""The extension's Python module name (ops.cpp's PYBIND11_MODULE)."""
LIBRARY = f"{MODULE}.so"
FAILED_SUFFIX = ".failed.json"
CUDA_ARCH = "-gencode=arch=compute_90a,code=sm_90a"


def native_sources() -> Path:
    """The folder of the extension's sources: `cutlass_tune/native` (shipped in the wheel)."""
    checkout = Path(__file__).resolve().parent.parent / "native"
    return checkout if checkout.is_dir() else shipped("native")


@dataclasses.dataclass(frozen=True)
class TorchABI:
    """What of the installed torch and Python a built extension is bound to."""

    torch_version: str
    cxx11_abi: bool
    cuda: str | None
    """torch's CUDA version, None for a CPU build."""
    python_abi: str
    """The extension suffix of this interpreter (`.cpython-311-x86_64-linux-gnu.so`)."""

    @classmethod
    def current(cls) -> TorchABI:
        import torch

        return cls(str(torch.__version__), bool(torch._C._GLIBCXX_USE_CXX11_ABI), torch.version.cuda,
                   str(sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag))


def abi_defines(abi: TorchABI) -> tuple[str, ...]:
    return (f"-D_GLIBCXX_USE_CXX11_ABI={int(abi.cxx11_abi)}", f"-DCUTLASS_TUNE_NATIVE_CUDA={int(abi.cuda is not None)}",
            f"-DTORCH_EXTENSION_NAME={MODULE}")


def abi_libraries(abi: TorchABI, cu: bool) -> tuple[str, ...]:
    cuda = ("c10_cuda", "torch_cuda", *(("cudart",) if cu else ())) if abi.cuda is not None else ()
    return ("c10", "torch", "torch_cpu", "torch_python", *cuda)


def source_files(sources: Path, abi: TorchABI) -> tuple[tuple[Path, ...], tuple[Path, ...], tuple[Path, ...]]:
    """The `.cpp`, `.cu` (where torch has CUDA) and `.h` files of `sources`, sorted."""
    cu = tuple(sorted(sources.glob("*.cu"))) if abi.cuda is not None else ()
    return tuple(sorted(sources.glob("*.cpp"))), cu, tuple(sorted(sources.glob("*.h")))


LINK_REVISION = "link: the process's shared C++ runtime"
"""Part of every key: libraries linked before it (which could carry a static C++ runtime) are
rebuilt rather than loaded."""


def content_key(files: tuple[Path, ...], abi: TorchABI, defines: tuple[str, ...], libraries: tuple[str, ...],
         cu: bool) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    facts = [abi.torch_version, str(abi.cxx11_abi), str(abi.cuda), abi.python_abi, *defines, *libraries,
             CUDA_ARCH if cu else "", LINK_REVISION]
    digest.update("\n".join(facts).encode())
    return digest.hexdigest()


def native_key(sources: Path | None = None, abi: TorchABI | None = None) -> str:
    """The cache key of the extension for the installed torch (or `abi`), as `native_spec(...).key`
    gives it, without torch's build helpers (a lookup at import costs a few milliseconds)."""
    sources = sources or native_sources()
    abi = abi or TorchABI.current()
    cpp, cu, headers = source_files(sources, abi)
    return content_key((*cpp, *cu, *headers), abi, abi_defines(abi), abi_libraries(abi, bool(cu)), bool(cu))


@dataclasses.dataclass(frozen=True)
class NativeBuild:
    """What building (or finding) the extension gave: its library, or why there is none."""

    key: str
    library: Path | None
    reason: str = ""
    cached: bool = False
    seconds: float = 0.0
    log_path: Path | None = None


def cached_builds(root: Path | None = None) -> Path:
    """The kernel cache's folder of native builds (`root`: the cache's, else the settings'), as
    the compile stage's `native_dir` makes it (cache layout v1)."""
    return (root if root is not None else settings.cache_dir()) / "v1" / "native"


def find_native(key: str, folder: Path) -> NativeBuild | None:
    """The outcome of the build `key` recorded in `folder` (the cache's `native_dir`, or a
    bundle's `native/`): its library, checked against its recorded size and SHA-256; its recorded
    failure; a library that is not what was built (`library` None, `cached` False: refused, and
    rebuilt by `build_native`); or None where it was never built."""
    library = folder / key / LIBRARY
    if library.is_file():
        try:
            recorded = json.loads((folder / key / "library.json").read_text())
            if recorded == {"bytes": library.stat().st_size, "sha256": sha256_of(library)}:
                return NativeBuild(key, library, cached=True, log_path=folder / key / "build.log")
        except (OSError, ValueError):
            pass
        return NativeBuild(key, None, reason=f"{library} is not the library that was built (its size or SHA-256 "
                           "differs from library.json): refused; rebuild it with cutlass-tune native --build")
    try:
        failed = json.loads((folder / f"{key}{FAILED_SUFFIX}").read_text())
        return NativeBuild(key, None, reason=f"its build failed: {failed['reason']}", cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


