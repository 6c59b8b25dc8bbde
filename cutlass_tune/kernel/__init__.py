"""Kernel stage: a compiled kernel library loaded through its C ABI and called.

`_abi` declares the ABI once (its version, the argument struct `GemmArgs` and `make_args`, the
entry points' ctypes signatures, CUTLASS's status names); render writes the same version into
every library. `LoadedKernel` binds one kernel of a library and `GemmInstance` runs it;
`bind_primary_context` makes a thread ready for a kernel's host code. Imports neither the
compiler nor torch: the bench stage's GPU worker and the runtime both stand on it.
"""

from ._abi import ABI_VERSION, CUTLASS_STATUS, ENTRY_POINTS, GemmArgs, cutlass_status_name, make_args
from ._context import bind_primary_context
from ._loaded import GemmInstance, KernelLoadError, KernelStatusError, LoadedKernel

__all__ = ["ABI_VERSION", "CUTLASS_STATUS", "ENTRY_POINTS", "GemmArgs", "GemmInstance", "KernelLoadError",
           "KernelStatusError", "LoadedKernel", "bind_primary_context", "cutlass_status_name", "make_args"]
