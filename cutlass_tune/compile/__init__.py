"""Compile stage: rendered source -> cached shared object."""

from ._cache import CompiledKernel, KernelCache, intact
from ._driver import compile_kernels, default_jobs, kernel_key, plan_units, spill_bytes_by_symbol
from ._toolchain import NVCC_FLAGS, Toolchain, find_toolchain

__all__ = [
    "CompiledKernel", "KernelCache", "NVCC_FLAGS", "Toolchain", "compile_kernels", "default_jobs",
    "find_toolchain", "intact", "kernel_key", "plan_units", "spill_bytes_by_symbol",
]
