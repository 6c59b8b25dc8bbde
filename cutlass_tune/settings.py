"""Every CUTLASS_TUNE_* environment variable the package reads, in one place as a typed value
(the test suite's own, CUTLASS_TUNE_TEST_*, are described in tests/conftest.py).

| variable | meaning | default |
|---|---|---|
| CUTLASS_TUNE_CACHE_DIR | where compiled kernels are cached | the user cache dir (platformdirs) |
| CUTLASS_TUNE_NVCC | the nvcc to run | `nvcc` on PATH, else $CUDA_HOME (or $CUDA_PATH, or /usr/local/cuda)/bin/nvcc |
| CUTLASS_TUNE_JOBS | parallel nvcc jobs | bounded by cores and memory |
| CUTLASS_TUNE_COMPILE_TIMEOUT | seconds before one nvcc job is killed | 900 |
| CUTLASS_TUNE_NVCC_MEMORY_GB | memory one nvcc job is assumed to peak at | 3.2 |
| CUTLASS_TUNE_NATIVE | 0: the operators never load their native (C++) library | 1 |
| CUTLASS_TUNE_EXTERN | 0: torch.compile calls the operators through the dispatcher, not as extern kernels | 1 |
| CUTLASS_TUNE_MOE_BATCHED_ROWS | MoE `decode="auto"`: batched GEMMs up to this many tokens x top_k | 0 (never) |
| CUTLASS_TUNE_STORE | the store `best`, `dashboard`, `export`, `confirm` read with no `--storage` | `DEFAULT_STORE` |
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import platformdirs

from ._files import shipped
from .errors import CutlassTuneError

DEFAULT_STORE = "results/squares-paired-nvidia-h100-80gb-hbm3.sqlite"
"""The committed store behind the README's headline table (bf16 squares on an H100, paired
baselines, the leaders confirmed over three passes), relative to the working directory."""


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


def _number(name: str, default: float, kind: type = float) -> float:
    raw = _env(name)
    if raw is None:
        return default
    noun = {int: "whole number", float: "number"}[kind]
    try:
        value = kind(raw)
    except ValueError as err:
        raise CutlassTuneError(f"{name}={raw!r} is not a {noun}") from err
    if not math.isfinite(value) or value <= 0:
        raise CutlassTuneError(f"{name}={raw!r} must be a finite positive {noun}")
    return value


def user_path(raw: str | Path, given_as: str) -> Path:
    """`raw` with a leading `~` or `~user` expanded, as a shell would.

    Raises:
        CutlassTuneError: `~user` names no user of this host (`given_as` says where it was given).
    """
    try:
        return Path(raw).expanduser()
    except RuntimeError as err:  # "Could not determine home directory."
        raise CutlassTuneError(f"{given_as}={str(raw)!r}: {str(raw).split('/')[0]} is no user's home here") from err


def cache_dir() -> Path:
    """Root of the kernel cache."""
    raw = _env("CUTLASS_TUNE_CACHE_DIR")
    return user_path(raw, "CUTLASS_TUNE_CACHE_DIR") if raw else Path(platformdirs.user_cache_dir("cutlass-tune"))


def default_store() -> str:
    """The store (URL or .sqlite path) that the reading commands use when given no `--storage`."""
    return _env("CUTLASS_TUNE_STORE") or DEFAULT_STORE


def bundled_config(name: str) -> Path:
    """The search-space file `name` (e.g. `sm90_bf16.yaml`) shipped with the package.

    Raises:
        CutlassTuneError: no bundled config has that name.
    """
    root = shipped("configs")
    path = root / name
    if not path.is_file():
        bundled = ", ".join(sorted(p.name for p in root.glob("*.yaml")))
        raise CutlassTuneError(f"no bundled config {name!r} (bundled: {bundled})")
    return path


def nvcc_path() -> str | None:
    """The nvcc to use, or None when none can be found."""
    raw = _env("CUTLASS_TUNE_NVCC")
    if raw:
        return raw
    found = shutil.which("nvcc")
    if found:
        return found
    home = _env("CUDA_HOME") or _env("CUDA_PATH") or "/usr/local/cuda"
    candidate = Path(home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else None


def native_enabled() -> bool:
    """Whether the operators may load their native library (`CUTLASS_TUNE_NATIVE` is not "0")."""
    return _env("CUTLASS_TUNE_NATIVE") != "0"


def extern_enabled() -> bool:
    """Whether Inductor may call the operators as extern kernels with out= (`CUTLASS_TUNE_EXTERN`
    is not "0"; runtime/_lowering.py)."""
    return _env("CUTLASS_TUNE_EXTERN") != "0"


def compile_jobs() -> int | None:
    """Parallel nvcc jobs requested by the environment, or None for the automatic bound."""
    return int(_number("CUTLASS_TUNE_JOBS", 0, int)) if _env("CUTLASS_TUNE_JOBS") else None


def compile_timeout_s() -> float:
    return _number("CUTLASS_TUNE_COMPILE_TIMEOUT", 900.0)


def nvcc_memory_bytes() -> int:
    gb = _number("CUTLASS_TUNE_NVCC_MEMORY_GB", 3.2)
    if not 0.01 <= gb <= 1e6:
        raise CutlassTuneError(f"CUTLASS_TUNE_NVCC_MEMORY_GB={_env('CUTLASS_TUNE_NVCC_MEMORY_GB')!r} must be "
                               "between 0.01 and 1000000 (GB)")
    return int(gb * 1e9)


def moe_batched_rows() -> int:
    """Up to this many routed rows (tokens x top_k) the MoE experts layer's `decode="auto"` runs
    one batched GEMM per routed row instead of the grouped GEMMs; 0 (the default): never. Set it
    from a measurement (`benchmarks/moe_layer.py --mode graphs` at decode sizes: the largest
    routed rows at which the "moe_batched" side beats "moe_experts").

    Raises:
        CutlassTuneError: a value that is not a whole number of 0 or more.
    """
    raw = _env("CUTLASS_TUNE_MOE_BATCHED_ROWS")
    if raw is None:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise CutlassTuneError(f"CUTLASS_TUNE_MOE_BATCHED_ROWS={raw!r} must be a whole number of 0 or more")
    return value


def check() -> None:
    """Read every numeric setting once, so a malformed one stops a command before it starts.

    Raises:
        CutlassTuneError: a setting that is not a finite positive number.
    """
    compile_jobs()
    compile_timeout_s()
    moe_batched_rows()
    nvcc_memory_bytes()
