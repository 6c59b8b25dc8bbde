"""Where nvcc and the CUTLASS headers are, which versions they are, and the flags we use."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import re
import subprocess
from pathlib import Path

from .. import settings
from ..errors import ToolchainError

NVCC_FLAGS: tuple[str, ...] = (
    # -gencode, not -arch=sm_90a: the latter adds a compute_90 pass that costs ~5 s.
    "-gencode=arch=compute_90a,code=sm_90a",
    "-O3",
    # Without NDEBUG, device asserts serialize wgmma (ptxas warning C7510).
    "-DNDEBUG",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-shared",
    # Resource report (registers, spills) lands in the build log.
    "-Xptxas=-v",
)


@dataclasses.dataclass(frozen=True)
class Toolchain:
    nvcc: str
    nvcc_version: str
    cutlass_root: Path
    cutlass_version: str
    flags: tuple[str, ...] = NVCC_FLAGS

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        return (self.cutlass_root / "include", self.cutlass_root / "tools" / "util" / "include")

    @property
    def fingerprint(self) -> str:
        """Hash of everything besides the source that changes the binary."""
        blob = "\n".join([self.nvcc_version, self.cutlass_version, *self.flags])
        return hashlib.sha256(blob.encode()).hexdigest()

    def command(self, source: Path, output: Path) -> list[str]:
        includes = [f"-I{d}" for d in self.include_dirs]
        return [self.nvcc, *self.flags, *includes, "-o", str(output), str(source)]


def cutlass_source_root() -> Path:
    """The C++ tree shipped in the nvidia-cutlass wheel (found without importing it)."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("the nvidia-cutlass package is not installed (pip install nvidia-cutlass)")
    root = Path(next(iter(spec.submodule_search_locations))) / "source"
    if not (root / "include" / "cutlass" / "version.h").exists():
        raise ToolchainError(f"CUTLASS headers not found under {root}")
    return root


def cutlass_version(root: Path) -> str:
    text = (root / "include" / "cutlass" / "version.h").read_text()
    found = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    parts = [m.group(1) for m in found if m is not None]
    if len(parts) != len(found):
        raise ToolchainError(f"cannot read the CUTLASS version from {root}/include/cutlass/version.h")
    return ".".join(parts)


def nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, errors="replace", timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ToolchainError(f"cannot run {nvcc}: {err}") from err
    found = re.search(r"V(\d+\.\d+\.\d+)", out)
    if not found:
        raise ToolchainError(f"cannot read the version of {nvcc}")
    return found.group(1)


@functools.cache
def find_toolchain(nvcc: str | None = None) -> Toolchain:
    """Locate nvcc and CUTLASS. Raises ToolchainError with what to install when either is missing."""
    nvcc = nvcc or settings.nvcc_path()
    if nvcc is None:
        raise ToolchainError("nvcc not found: install the CUDA toolkit or set CUTLASS_TUNE_NVCC")
    root = cutlass_source_root()
    return Toolchain(nvcc=nvcc, nvcc_version=nvcc_version(nvcc), cutlass_root=root,
                     cutlass_version=cutlass_version(root))
