"""ctypes bindings to the C entry points every compiled kernel exports.

The ABI is defined in templates/gemm_sm90_unit.cu.j2: `cutlass_tune_abi_version()` per
library, and per kernel symbol S the functions S_shared_storage_bytes, S_stages, S_mma_n,
S_workspace_size, S_can_implement, S_create, S_destroy, S_initialize and S_run. Statuses are
`cutlass::Status` values (0 is kSuccess).

Not thread-safe: one `GemmInstance` belongs to one thread (a bench worker, or a thread calling a `Gemm`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from .. import render
from ..space import Problem, RuntimeArgs

CUTLASS_STATUS = (
    "kSuccess", "kErrorMisalignedOperand", "kErrorInvalidDataType", "kErrorInvalidLayout",
    "kErrorInvalidProblem", "kErrorNotSupported", "kErrorWorkspaceNull", "kErrorInternal",
    "kErrorArchMismatch", "kErrorInsufficientDriver", "kErrorMemoryAllocation", "kInvalid",
)
"""cutlass::Status enumerators in declaration order (cutlass/cutlass.h)."""


def cutlass_status_name(code: int) -> str:
    return CUTLASS_STATUS[code] if 0 <= code < len(CUTLASS_STATUS) else f"status {code}"


class GemmArgs(ctypes.Structure):
    """Mirror of `struct cutlass_tune_args` (natural alignment, 112 bytes on LP64)."""

    _fields_ = [
        ("m", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("a", ctypes.c_void_p),
        ("b", ctypes.c_void_p),
        ("c", ctypes.c_void_p),
        ("d", ctypes.c_void_p),
        ("alpha", ctypes.c_float),
        ("beta", ctypes.c_float),
        ("raster", ctypes.c_int32),
        ("swizzle", ctypes.c_int32),
        ("splits", ctypes.c_int32),
        ("decomposition", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("sm_count", ctypes.c_int32),
        ("bias", ctypes.c_void_p),
        ("scale_a", ctypes.c_void_p),
        ("scale_b", ctypes.c_void_p),
    ]


def make_args(problem: Problem, runtime: RuntimeArgs, *, a: int, b: int, d: int,
              device_id: int, sm_count: int, c: int | None = None, bias: int | None = None,
              scale_a: int | None = None, scale_b: int | None = None, alpha: float = 1.0,
              beta: float | None = None) -> GemmArgs:
    """Arguments for D = epilogue(alpha * A @ B [+ beta * C]) of `problem`.

    `a`, `b`, `d` are device addresses of the storage `Operands` describes: A is M x K
    row-major (`layout_a` ROW) or K x M row-major (COL); B is N x K row-major (`layout_b` COL)
    or K x N row-major (ROW); D is M x N row-major. The kernel's layout tags encode the same.
    `c` (M x N row-major, D's type) is read only by a residual epilogue; without one it aliases
    D and beta is 0. `bias` is N values of D's type; `scale_a`/`scale_b` are fp32 (one value
    each for `Scaling.TENSOR`; M and N values for `Scaling.ROWCOL`). `beta` defaults to 1 with a
    residual, else 0.
    """
    if beta is None:
        beta = 1.0 if problem.epilogue.residual else 0.0
    return GemmArgs(
        m=problem.m, n=problem.n, k=problem.k, a=a, b=b, c=d if c is None else c, d=d,
        alpha=alpha, beta=beta,
        raster=int(runtime.raster), swizzle=runtime.swizzle, splits=runtime.splits,
        decomposition=int(runtime.decomposition), device_id=device_id, sm_count=sm_count,
        bias=bias, scale_a=scale_a, scale_b=scale_b,
    )


class KernelLoadError(Exception):
    """A library cannot be loaded, lacks a symbol, or was built for another ABI version."""


class KernelStatusError(RuntimeError):
    """An entry point returned a cutlass::Status other than kSuccess."""

    def __init__(self, call: str, code: int):
        self.call, self.code = call, code
        super().__init__(f"{call} returned {cutlass_status_name(code)}")


_ARGS_P = ctypes.POINTER(GemmArgs)
_SIGNATURES = {
    "shared_storage_bytes": (ctypes.c_int, []),
    "stages": (ctypes.c_int, []),
    "mma_n": (ctypes.c_int, []),
    "workspace_size": (ctypes.c_size_t, [_ARGS_P]),
    "can_implement": (ctypes.c_int, [_ARGS_P]),
    "create": (ctypes.c_void_p, []),
    "destroy": (None, [ctypes.c_void_p]),
    "initialize": (ctypes.c_int, [ctypes.c_void_p, _ARGS_P, ctypes.c_void_p, ctypes.c_void_p]),
    "run": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
}


class LoadedKernel:
    """One kernel symbol of a loaded shared object.

    Raises:
        KernelLoadError: from the constructor, when the library cannot be used.
    """

    def __init__(self, library: str | Path, symbol: str):
        self.library, self.symbol = Path(library), symbol
        try:
            lib = ctypes.CDLL(str(self.library))
            version = lib.cutlass_tune_abi_version
        except (OSError, AttributeError) as err:
            raise KernelLoadError(f"cannot load {self.library}: {err}") from err
        version.restype, version.argtypes = ctypes.c_int, []
        if version() != render.ABI_VERSION:
            raise KernelLoadError(f"{self.library} has ABI version {version()}, this cutlass-tune "
                                  f"expects {render.ABI_VERSION}: rebuild it (clear the kernel cache)")
        self._fn = {}
        for name, (restype, argtypes) in _SIGNATURES.items():
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
