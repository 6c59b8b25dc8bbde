"""A compiled kernel library loaded, its ABI version checked and its entry points bound (`_abi`).

Not thread-safe: one `GemmInstance` belongs to one thread (a bench worker, or a thread calling a `Gemm`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from ._abi import ABI_VERSION, ENTRY_POINTS, VERSION_SYMBOL, GemmArgs, cutlass_status_name


class KernelLoadError(Exception):
    """A library cannot be loaded, lacks a symbol, or was built for another ABI version."""


class KernelStatusError(RuntimeError):
    """An entry point returned a cutlass::Status other than kSuccess."""

    def __init__(self, call: str, code: int):
        self.call, self.code = call, code
        super().__init__(f"{call} returned {cutlass_status_name(code)}")


class LoadedKernel:
    """One kernel symbol of a loaded shared object.

    Raises:
        KernelLoadError: from the constructor, when the library cannot be used.
    """

    def __init__(self, library: str | Path, symbol: str):
        self.library, self.symbol = Path(library), symbol
        try:
            lib = ctypes.CDLL(str(self.library))
            version = getattr(lib, VERSION_SYMBOL)
        except (OSError, AttributeError) as err:
            raise KernelLoadError(f"cannot load {self.library}: {err}") from err
        version.restype, version.argtypes = ctypes.c_int, []
        if version() != ABI_VERSION:
            raise KernelLoadError(f"{self.library} has ABI version {version()}, this cutlass-tune "
                                  f"expects {ABI_VERSION}: rebuild it (clear the kernel cache)")
        self._fn = {}
        for name, (restype, argtypes) in ENTRY_POINTS.items():
            try:
                fn = getattr(lib, f"{symbol}_{name}")
            except AttributeError as err:
                raise KernelLoadError(f"{self.library} does not export {symbol}_{name}") from err
            fn.restype, fn.argtypes = restype, argtypes
            self._fn[name] = fn
        self._lib = lib

    def shared_storage_bytes(self) -> int:
        return self._fn["shared_storage_bytes"]()

    def stages(self) -> int:
        return self._fn["stages"]()

    def mma_n(self) -> int:
        """N of the kernel's wgmma instruction (its tiled MMA's atom)."""
        return self._fn["mma_n"]()

    def workspace_size(self, args: GemmArgs) -> int:
        return self._fn["workspace_size"](ctypes.byref(args))

    def can_implement(self, args: GemmArgs) -> int:
        """cutlass::Status code of `Gemm::can_implement` (0 when the kernel can run `args`)."""
        return self._fn["can_implement"](ctypes.byref(args))

    def create(self) -> GemmInstance:
        return GemmInstance(self)


class GemmInstance:
    """A `Gemm` object of one kernel (S_create); `initialize` binds it to arguments.

    Device addresses in the arguments and the workspace must outlive the instance's use.
    """

    def __init__(self, kernel: LoadedKernel):
        self._fn = kernel._fn
        self._handle = self._fn["create"]()
        if not self._handle:
            raise MemoryError(f"{kernel.symbol}_create returned NULL")

    def initialize(self, args: GemmArgs, workspace: int | None, stream: int) -> None:
        """Build kernel parameters, zero the workspace and set the smem attribute (enqueued
        on `stream`). Raises KernelStatusError."""
        code = self._fn["initialize"](self._handle, ctypes.byref(args), workspace or None, stream or None)
        if code != 0:
            raise KernelStatusError("initialize", code)

    def run(self, stream: int) -> None:
        """Enqueue one launch on `stream`. Raises KernelStatusError when the launch fails."""
        code = self._fn["run"](self._handle, stream or None)
        if code != 0:
            raise KernelStatusError("run", code)

    def close(self) -> None:
        if self._handle:
            self._fn["destroy"](self._handle)
            self._handle = None

    def __enter__(self) -> GemmInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
