"""The operators' C++ extension (`cutlass_tune/native/`) as a build spec: sources plus torch's
include and library flags -> one shared object, cached by content and torch ABI, built under a
lock, published atomically, a failure recorded with its reason and not retried until asked.

The layout of a build and its key are `cutlass_tune.kernel._native`'s (a serving host finds a
built copy without this module). A build holds `locks/native-<key>.lock` of the kernel cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sysconfig
import time
from pathlib import Path

from .. import settings
from .._files import sha256_of, write_atomically
from ..errors import CutlassTuneError
from ..kernel._native import (
    CUDA_ARCH,
    FAILED_SUFFIX,
    LIBRARY,
    NativeBuild,
    TorchABI,
    abi_defines,
    abi_libraries,
    content_key,
    find_native,
    native_sources,
    source_files,
)
from ._cache import KernelCache
from ._driver import _Processes, transient_reason


class NativeBuildError(CutlassTuneError):
    """The extension cannot be built here (no compiler, no torch headers), or its build failed."""


@dataclasses.dataclass(frozen=True)
class NativeSpec:
    """One build of the extension: its sources, the compilers' flags and the ABI it binds to."""

    cpp: tuple[Path, ...]
    cu: tuple[Path, ...]
    headers: tuple[Path, ...]
    abi: TorchABI
    include_dirs: tuple[str, ...]
    library_dirs: tuple[str, ...]
    libraries: tuple[str, ...]
    defines: tuple[str, ...]
    cxx: str = "g++"
    nvcc: str | None = None

    @property
    def cxx_flags(self) -> tuple[str, ...]:
        return ("-O2", "-fPIC", "-std=c++20", "-fvisibility=hidden", *self.defines,
                *(f"-I{d}" for d in self.include_dirs))

    @property
    def key(self) -> str:
        """SHA-256 of the sources' contents, the flags and the ABI (see the module docstring)."""
        return content_key((*self.cpp, *self.cu, *self.headers), self.abi, self.defines, self.libraries, bool(self.cu))

    def commands(self, build: Path) -> list[list[str]]:
        """The compiler runs that build `build/LIBRARY`: one per source into an object, then the link."""
        objects, runs = [], []
        for i, source in enumerate(self.cpp):
            obj = build / f"{i}-{source.stem}.o"
            runs.append([self.cxx, "-c", *self.cxx_flags, str(source), "-o", str(obj)])
            objects.append(obj)
        for i, source in enumerate(self.cu):
            obj = build / f"cu{i}-{source.stem}.o"
            assert self.nvcc is not None, "a spec with .cu sources names its nvcc"
            runs.append([self.nvcc, "-c", CUDA_ARCH, "-O2", "-std=c++20", "-Xcompiler=-fPIC,-fvisibility=hidden",
                         *NVCC_TORCH_FLAGS, *self.defines, *(f"-I{d}" for d in self.include_dirs),
                         str(source), "-o", str(obj)])
            objects.append(obj)
        link = [self.cxx, "-shared", *map(str, objects), *loaded_libstdcxx(), *(f"-L{d}" for d in self.library_dirs),
                *(f"-Wl,-rpath,{d}" for d in self.library_dirs), *(f"-l{lib}" for lib in self.libraries),
                "-o", str(build / LIBRARY)]
        return [*runs, link]


def loaded_libstdcxx(maps: Path = Path("/proc/self/maps")) -> tuple[str, ...]:
    """The C++ runtime this process (and so torch) runs on, as a link input, where it is found.

    Named first on the link line, it satisfies every C++ runtime symbol, so the compiler driver's
    own `-lstdc++` never pulls members of a static `libstdc++.a`: a library carrying its own copy
    of the stream and locale code crashed on the H200 host when a failed check formatted an
    integer into its message (two copies of the locale's facet ids in one process).
    """
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return ()
    found = sorted({line.split()[-1] for line in lines if "/libstdc++.so" in line and line.split()[-1].startswith("/")})
    return (found[0],) if found else ()


NVCC_TORCH_FLAGS = ("--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__")
"""What torch's own extension builds pass nvcc: CUDA's half and bfloat16 operators would clash with c10's."""


def _cuda_home(nvcc: str | None, torch_cuda_home: str | None) -> Path | None:
    """The CUDA toolkit whose headers the build includes: the first of $CUDA_HOME, $CUDA_PATH,
    the folder above `nvcc`'s bin/ (links resolved), torch's CUDA_HOME and /usr/local/cuda that
    holds include/cuda_runtime_api.h (an nvcc on PATH may be a wrapper script elsewhere)."""
    found = shutil.which(nvcc) if nvcc else None
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                  str(Path(os.path.realpath(found)).parent.parent) if found else None, torch_cuda_home,
                  "/usr/local/cuda"]
    for home in candidates:
        if home and (Path(home) / "include" / "cuda_runtime_api.h").is_file():
            return Path(home)
    return None


def native_spec(sources: Path | None = None, abi: TorchABI | None = None) -> NativeSpec:
    """The build of the extension for the installed torch (or `abi`): the `.cpp` files always,
    the `.cu` files where torch has CUDA; `-DCUTLASS_TUNE_NATIVE_CUDA=0` and torch's CPU
    libraries on a CPU torch, `=1` with c10_cuda and torch_cuda (and the toolkit's headers) on a
    CUDA one.

    Raises:
        NativeBuildError: torch has CUDA and no CUDA toolkit (nvcc) is found for its headers.
    """
    import torch.utils.cpp_extension as cpp_extension

    sources = sources or native_sources()
    abi = abi or TorchABI.current()
    cuda = abi.cuda is not None
    cpp, cu, headers = source_files(sources, abi)
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    library_dirs = list(cpp_extension.library_paths())
    nvcc = settings.nvcc_path() if cuda else None
    if cuda:
        home = _cuda_home(nvcc, getattr(cpp_extension, "CUDA_HOME", None))
        if home is None:
            raise NativeBuildError("torch has CUDA and no CUDA toolkit was found for its headers: install it or "
                                   "set CUTLASS_TUNE_NVCC")
        includes.append(str(home / "include"))
        if cu:
            library_dirs.append(str(home / "lib64"))
    return NativeSpec(cpp=cpp, cu=cu, headers=headers, abi=abi, include_dirs=tuple(includes),
                      library_dirs=tuple(library_dirs), libraries=abi_libraries(abi, bool(cu)),
                      defines=abi_defines(abi), cxx=os.environ.get("CXX") or "g++", nvcc=nvcc)


def _first_error(log: str, otherwise: str) -> str:
    """The compiler's first error line in `log` (its last line where none says error)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[-1] if lines else otherwise)[:300]


def native_dir(cache: KernelCache) -> Path:
    """The cache's folder of native builds (see `cutlass_tune.kernel._native`)."""
    folder = cache.root / "native"
    folder.mkdir(exist_ok=True)
    return folder


def build_native(spec: NativeSpec | None = None, cache: KernelCache | None = None, *, retry: bool = False,
                 timeout: float | None = None) -> NativeBuild:
    """The extension of `spec` (default: `native_spec()`) in `cache`: found there, or built now.
    A failure is recorded with its reason and returned as it is by later calls, unless `retry`.
    Process-safe: a build holds the key's lock, and the cache is checked again inside it.

    Raises:
        NativeBuildError: no spec can be made (see `native_spec`).
    """
    spec = spec or native_spec()
    cache = cache or KernelCache.at()
    key = spec.key
    found = find_native(key, native_dir(cache))
    if found is not None and (found.library is not None or (found.cached and not retry)):
        return found
    with cache.lock(f"native-{key}"):
        found = find_native(key, native_dir(cache))
        if found is not None and (found.library is not None or (found.cached and not retry)):
            return found
        return _build(spec, key, cache, timeout or settings.compile_timeout_s())


def _build(spec: NativeSpec, key: str, cache: KernelCache, timeout: float) -> NativeBuild:
    folder = native_dir(cache)
    build = cache.new_build_dir()
    processes = _Processes()
    start = time.monotonic()
    try:
        log = ""
        for i, command in enumerate(spec.commands(build)):
            code, out = processes.run(command, build / f"step{i}.log", timeout)
            log += f"$ {' '.join(command)}\n{out}\n"
            if code != 0:
                transient = transient_reason(code, out) if code is not None else None
                reason = (f"{Path(command[0]).name} exceeded {timeout:.0f} s" if code is None
                          else transient or _first_error(out, f"{Path(command[0]).name} exited {code}"))
                if code is not None and transient is None:  # the compiler's diagnosis: kept, with its log
                    write_atomically(folder / f"{key}.failed.log", log)
                    reason = f"{reason} (log {folder / f'{key}.failed.log'})"
                    write_atomically(folder / f"{key}{FAILED_SUFFIX}", json.dumps({"reason": reason}))
                return NativeBuild(key, None, reason=reason, seconds=time.monotonic() - start)
        (build / "build.log").write_text(log)
        for stale in build.glob("*.o"):
            stale.unlink()
        library = build / LIBRARY
        (build / "library.json").write_text(json.dumps({"bytes": library.stat().st_size,
                                                        "sha256": sha256_of(library)}))
        target = folder / key
        try:
            os.rename(build, target)
        except OSError:
            found = find_native(key, folder)
            if found is None or found.library is None:  # a damaged copy in place: ours replaces it
                shutil.rmtree(target, ignore_errors=True)
                os.rename(build, target)
        (folder / f"{key}{FAILED_SUFFIX}").unlink(missing_ok=True)
        return NativeBuild(key, target / LIBRARY, seconds=time.monotonic() - start, log_path=target / "build.log")
    finally:
        shutil.rmtree(build, ignore_errors=True)
