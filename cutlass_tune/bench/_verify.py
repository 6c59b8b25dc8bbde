"""Operands in the storage a `Problem` describes, an fp32 reference, and the correctness check.

A kernel's time counts only after its output, from fresh random inputs into an output
poisoned with NaN, matches the reference: ||out - ref||_F / ||ref||_F within the tolerance of
the output type (looser for fp8 inputs), and no single element further from it than a bound in
units of the reference's RMS. The reference multiplies the same (already rounded)
inputs in fp32, so the error left is accumulation order and precision and the rounding of the
output; the quantization of fp8 inputs is never counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..space import DType, Layout, Problem
from ..status import Status

TOLERANCE = {DType.BF16: 1e-2, DType.F16: 2e-3, DType.F32: 1e-4}
"""Largest relative Frobenius error accepted, by output type. An output rounded to bf16
(f16) carries about 2e-3 (3e-4) of relative error by itself; fp32 accumulation about 1e-6."""

FP8_TOLERANCE = 2e-2
"""Largest relative Frobenius error accepted for fp8 inputs (any output type). Hopper's fp8
wgmma accumulates in fewer bits than fp32 (about 14, DeepSeek-V3 reports, with up to 2% error
in single elements at K = 4096). CUTLASS's FP8FastAccum kernels keep the whole K loop in that
accumulator, the others promote it to fp32 every 4 k-steps; over random data the Frobenius
error of fast accumulation should be near sqrt(K) * 2^-14 (4e-3 at K = 4096). 2e-2 leaves room
for large K and still fails a kernel that drops one 32-wide K step of 4096 (error 9e-2)."""

ELEMENT_TOLERANCE = {DType.BF16: 0.1, DType.F16: 0.02, DType.F32: 2e-3}
"""Largest error accepted in any one element, in units of the reference's RMS, by output type.
The Frobenius bound averages over the whole output, so a wrong block of a few tiles (a bad
partial tile or residue) can hide in it; this bound does not let one. Rounding to bf16 (f16)
moves an element by at most 2^-8 (2^-11) of its size, and over millions of normal values the
largest sits near 5.5 RMS: 0.022 (0.003) of the RMS at most, 4-7x below the bound."""

FP8_ELEMENT_TOLERANCE = 0.25
"""The same bound for fp8 inputs (any output type): their reduced-precision accumulation
leaves single elements off by up to about 2% of their size (about 0.1 RMS at 5 RMS)."""

TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F16: torch.float16, DType.F32: torch.float32,
               DType.E4M3: torch.float8_e4m3fn, DType.E5M2: torch.float8_e5m2}


def tolerance(dtype: DType, fp8_inputs: bool = False) -> float:
    """Largest relative Frobenius error accepted for an output of type `dtype`."""
    return max(FP8_TOLERANCE, TOLERANCE[dtype]) if fp8_inputs else TOLERANCE[dtype]


def element_tolerance(dtype: DType, fp8_inputs: bool = False) -> float:
    """Largest error of one element, in units of the reference's RMS, accepted for `dtype`."""
    return max(FP8_ELEMENT_TOLERANCE, ELEMENT_TOLERANCE[dtype]) if fp8_inputs else ELEMENT_TOLERANCE[dtype]


@dataclasses.dataclass(frozen=True)
class Operands:
    """Device tensors of one problem, stored as the kernel reads and writes them.

    `a` is M x K row-major (layout_a ROW) or K x M row-major (COL, i.e. column-major M x K);
    `b` is N x K row-major (layout_b COL, the nn.Linear weight) or K x N row-major (ROW);
    `d` is M x N row-major. `a_mk` and `b_kn` are the logical matrices as views.
    """

    problem: Problem
    a: torch.Tensor
    b: torch.Tensor
    d: torch.Tensor

    @property
    def a_mk(self) -> torch.Tensor:
        return self.a if self.problem.layout_a is Layout.ROW else self.a.t()

    @property
    def b_kn(self) -> torch.Tensor:
        return self.b.t() if self.problem.layout_b is Layout.COL else self.b

    @property
    def nbytes(self) -> int:
        """Bytes one GEMM reads and writes: A, B and D."""
        return sum(t.numel() * t.element_size() for t in (self.a, self.b, self.d))

    def copy(self) -> Operands:
        """Operands in new storage: A and B with the same values, D uninitialized."""
        return dataclasses.replace(self, a=self.a.clone(), b=self.b.clone(), d=torch.empty_like(self.d))


def allocate(problem: Problem, device: torch.device | str) -> Operands:
    """Uninitialized operands for `problem` on `device`."""
    p = problem
    a_shape = (p.m, p.k) if p.layout_a is Layout.ROW else (p.k, p.m)
    b_shape = (p.n, p.k) if p.layout_b is Layout.COL else (p.k, p.n)
    return Operands(
        problem=p,
        a=torch.empty(a_shape, dtype=TORCH_DTYPE[p.dtype_a], device=device),
        b=torch.empty(b_shape, dtype=TORCH_DTYPE[p.dtype_b], device=device),
        d=torch.empty((p.m, p.n), dtype=TORCH_DTYPE[p.dtype_d], device=device),
    )


def randomize(ops: Operands, generator: torch.Generator) -> None:
    """Fill A and B with normal values: scaled so that D's entries are about N(0, 1) for
    16-bit inputs; N(0, 1) rounded to fp8 for fp8 inputs (D's entries about N(0, K))."""
    for t in (ops.a, ops.b):
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            _fill_fp8(t, generator)
        else:
            t.normal_(0.0, ops.problem.k ** -0.25, generator=generator)


def _fill_fp8(t: torch.Tensor, generator: torch.Generator) -> None:
    # Unit variance sits in the normal range of both fp8 formats (e4m3: 2^-6 .. 448), where
    # k^-0.25 scaling would push a tenth of the values into subnormals. The clamp keeps values
    # finite: e4m3fn has no infinity, and out-of-range conversions give NaN.
    limit = torch.finfo(t.dtype).max
    values = torch.randn(t.shape, generator=generator, device=t.device, dtype=torch.float32)
    t.copy_(values.clamp_(-limit, limit))


def reference(ops: Operands) -> torch.Tensor:
    """A @ B in fp32 (IEEE, no TF32) from the stored inputs, as an M x N fp32 tensor."""
    return torch.matmul(ops.a_mk.float(), ops.b_kn.float())


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: Status
    rel_error: float | None
    reason: str = ""
    worst_error: float | None = None
    """The largest error of one element, in units of the reference's RMS."""


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: DType, *, fp8_inputs: bool = False) -> Verdict:
    """Check `out` against `ref`: any NaN or infinity, a relative Frobenius error above
    `tolerance(dtype, fp8_inputs)`, or one element off by more than
    `element_tolerance(dtype, fp8_inputs)` of the reference's RMS, is a wrong result."""
    bad = out.numel() - int(torch.isfinite(out).sum())
    if bad:
        return Verdict(Status.WRONG_RESULT, None, f"{bad} of {out.numel()} output elements are "
                       "NaN or infinite (left unwritten, or overflowed)")
    diff = out.float() - ref
    ref_norm = torch.linalg.vector_norm(ref)
    err = float(torch.linalg.vector_norm(diff) / ref_norm)
    diff.abs_()
    flat = int(diff.argmax())  # in row-major order, whatever the strides
    worst = float(diff.max() / (ref_norm / ref.numel() ** 0.5))
    kind = f"a {dtype.value} output" + (" from fp8 inputs" if fp8_inputs else "")
    tol = tolerance(dtype, fp8_inputs)
    if not err <= tol:
        return Verdict(Status.WRONG_RESULT, err, f"relative error {err:.3g} exceeds {tol:g} allowed for {kind}",
                       worst)
    element_tol = element_tolerance(dtype, fp8_inputs)
    if not worst <= element_tol:
        row, col = divmod(flat, out.shape[1])
        return Verdict(Status.WRONG_RESULT, err, f"element ({row}, {col}) is off by {worst:.3g} of the "
                       f"reference's RMS, more than the {element_tol:g} allowed for {kind}", worst)
    return Verdict(Status.OK, err, worst_error=worst)


def verify_launch(launch: Callable[[], None], ops: Operands, ref: torch.Tensor) -> Verdict:
    """Poison D with NaN, launch once, wait, and compare D with `ref`.

    Raises:
        RuntimeError: a CUDA error surfaced at the synchronization.
    """
    ops.d.fill_(float("nan"))
    launch()
    if ops.d.is_cuda:
        torch.cuda.synchronize(ops.d.device)
    p = ops.problem
    return compare(ops.d, ref, p.dtype_d, fp8_inputs=p.dtype_a.is_fp8 or p.dtype_b.is_fp8)
