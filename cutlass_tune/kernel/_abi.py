"""The C ABI every compiled kernel library exports, as ctypes declares it.

The C side is templates/gemm_sm90_unit.cu.j2 (`struct cutlass_tune_args`, CUTLASS_TUNE_ABI and
`cutlass_tune_abi_version()`, once per library) and templates/gemm_sm90_kernel.cu.j2 (per
kernel symbol S, the functions S_<name> for each name of `ENTRY_POINTS`); tests/kernel/
checks that both sides declare the same fields and functions. Statuses are `cutlass::Status`
values (0 is kSuccess).
"""

from __future__ import annotations

import ctypes

from ..space import Problem, RuntimeArgs

ABI_VERSION = 4
"""Written into every library by render; a library or bundle of another version is refused.
2: kernels export S_mma_n; units that need them enable the extended wgmma shapes.
3: the arguments carry bias and fp8 scale pointers (fused epilogues).
4: the arguments carry a grouped GEMM's expert count and row offsets; a grouped kernel's
   workspace holds its per-group arrays, which `initialize` fills on the device and `run`
   refills from the offsets before each launch."""

VERSION_SYMBOL = "cutlass_tune_abi_version"
"""The library's function returning the ABI version it was built for (`int (void)`)."""

CUTLASS_STATUS = (
    "kSuccess", "kErrorMisalignedOperand", "kErrorInvalidDataType", "kErrorInvalidLayout",
    "kErrorInvalidProblem", "kErrorNotSupported", "kErrorWorkspaceNull", "kErrorInternal",
    "kErrorArchMismatch", "kErrorInsufficientDriver", "kErrorMemoryAllocation", "kInvalid",
)
"""cutlass::Status enumerators in declaration order (cutlass/cutlass.h)."""


def cutlass_status_name(code: int) -> str:
    return CUTLASS_STATUS[code] if 0 <= code < len(CUTLASS_STATUS) else f"status {code}"


class GemmArgs(ctypes.Structure):
    """Mirror of `struct cutlass_tune_args` (natural alignment, 128 bytes on LP64)."""

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
        ("groups", ctypes.c_int64),
        ("offsets", ctypes.c_void_p),
    ]


def make_args(problem: Problem, runtime: RuntimeArgs, *, a: int, b: int, d: int,
              device_id: int, sm_count: int, c: int | None = None, bias: int | None = None,
              scale_a: int | None = None, scale_b: int | None = None, alpha: float = 1.0,
              beta: float | None = None, offsets: int | None = None) -> GemmArgs:
    """Arguments for D = epilogue(alpha * A @ B [+ beta * C]) of `problem`.

    `a`, `b`, `d` are device addresses of the storage `Operands` describes: A is M x K
    row-major (`layout_a` ROW) or K x M row-major (COL); B is N x K row-major (`layout_b` COL)
    or K x N row-major (ROW); D is M x N row-major. The kernel's layout tags encode the same.
    `c` (M x N row-major, D's type) is read only by a residual epilogue; without one it aliases
    D and beta is 0. `bias` is N values of D's type; `scale_a`/`scale_b` are fp32 (one value
    each for `Scaling.TENSOR`; M and N values for `Scaling.ROWCOL`; M x K/128 (strides 1, M) and N/128 x K/128
    (row-major) for `Scaling.BLOCKWISE`). `beta` defaults to 1 with a
    residual, else 0.

    A grouped problem (`problem.grouped`): A is the M routed rows (M x K row-major), B the
    experts' weights one after another (E x N x K for `layout_b` COL, E x K x N for ROW), D the
    M x N outputs (M x N/2 with a GLU pair: `Epilogue.output_shape`); `offsets` is the device
    address of E int32 cumulative row ends (`torch._grouped_mm`'s `offs`: group e has rows
    offsets[e-1]..offsets[e]). A weight-gradient problem (`Grouping.GROUPED_K`) takes the same
    arguments for dW_e = G_e^T X_e: `a` is G (M x N row-major), `b` is X (M x K row-major), `d`
    is dW (E x N x K row-major), M the routed rows, N and K dW's; the kernel writes every
    expert's dW_e, 0 for one without rows.
    """
    if beta is None:
        beta = 1.0 if problem.epilogue.residual else 0.0
    return GemmArgs(
        m=problem.m, n=problem.n, k=problem.k, a=a, b=b, c=d if c is None else c, d=d,
        alpha=alpha, beta=beta,
        raster=int(runtime.raster), swizzle=runtime.swizzle, splits=runtime.splits,
        decomposition=int(runtime.decomposition), device_id=device_id, sm_count=sm_count,
        bias=bias, scale_a=scale_a, scale_b=scale_b,
        groups=problem.groups if problem.grouped else 0, offsets=offsets,
    )


_ARGS_P = ctypes.POINTER(GemmArgs)
ENTRY_POINTS: dict[str, tuple[type | None, list[type]]] = {
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
"""Each kernel's C functions S_<name>: (restype, argtypes) as ctypes takes them."""
