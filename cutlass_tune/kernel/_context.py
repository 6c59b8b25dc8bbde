"""The CUDA context a kernel's host code needs current on the thread that initializes it."""

from __future__ import annotations

import ctypes
import functools

from ._loaded import KernelLoadError


@functools.cache
def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise KernelLoadError(f"cannot load the CUDA driver (libcuda.so.1): {err}") from err


def _check(call: str, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{call} returned CUDA driver error {code}")


def bind_primary_context(device: int) -> None:
    """Make `device`'s primary context current on this thread where no context is.

    A thread's first CUDA runtime call binds the primary context, but a kernel's `initialize`
    builds its TMA descriptors through the driver first: on a thread that has run no CUDA work
    yet (autograd's backward threads, a fresh worker) cuTensorMapEncodeTiled fails with
    CUDA_ERROR_INVALID_CONTEXT and the kernel launches with broken descriptors (an illegal
    instruction). Binding the context is no stream operation: safe during CUDA graph capture.

    Raises:
        KernelLoadError: the driver cannot be loaded.
        RuntimeError: a driver call fails.
    """
    cuda = _driver()
    current = ctypes.c_void_p()
    _check("cuCtxGetCurrent", cuda.cuCtxGetCurrent(ctypes.byref(current)))
    if current.value:
        return
    handle, primary = ctypes.c_int(), ctypes.c_void_p()
    _check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(handle), device))
    # Retained for the process, as torch retains it: never released, so it cannot vanish under torch.
    _check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(primary), handle))
    _check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(primary))
