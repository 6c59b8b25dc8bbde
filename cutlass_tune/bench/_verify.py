"""Operands in the storage a `Problem` describes, an fp32 reference, and the correctness check.

A kernel's time counts only after its output, from fresh random inputs into an output
poisoned with NaN, matches the reference: ||out - ref||_F / ||ref||_F within the tolerance of
the output type. The reference multiplies the same (already rounded) inputs in fp32, so the
error left is accumulation order and the rounding of the output.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..space import DType, Layout, Problem
from ..status import Status

TOLERANCE = {DType.BF16: 1e-2, DType.F16: 2e-3, DType.F32: 1e-4}
"""Largest relative Frobenius error accepted, by output type. An output rounded to bf16
(f16) carries about 2e-3 (3e-4) of relative error by itself; fp32 accumulation about 1e-6."""

TORCH_DTYPE = {DType.BF16: torch.bfloat16, DType.F16: torch.float16, DType.F32: torch.float32}


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
    """Fill A and B with normal values scaled so that D's entries are about N(0, 1)."""
    std = ops.problem.k ** -0.25
    ops.a.normal_(0.0, std, generator=generator)
    ops.b.normal_(0.0, std, generator=generator)


def reference(ops: Operands) -> torch.Tensor:
    """A @ B in fp32 (IEEE, no TF32) from the stored inputs, as an M x N fp32 tensor."""
    return torch.matmul(ops.a_mk.float(), ops.b_kn.float())


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: Status
    rel_error: float | None
    reason: str = ""


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: DType) -> Verdict:
    """Check `out` against `ref`: any NaN or infinity, or a relative Frobenius error above
    `TOLERANCE[dtype]`, is a wrong result."""
    bad = out.numel() - int(torch.isfinite(out).sum())
    if bad:
        return Verdict(Status.WRONG_RESULT, None, f"{bad} of {out.numel()} output elements are "
                       "NaN or infinite (left unwritten, or overflowed)")
    err = float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))
    tol = TOLERANCE[dtype]
    if not err <= tol:
        return Verdict(Status.WRONG_RESULT, err, f"relative error {err:.3g} exceeds {tol:g} "
                       f"allowed for a {dtype.value} output")
    return Verdict(Status.OK, err)


def verify_launch(launch: Callable[[], None], ops: Operands, ref: torch.Tensor) -> Verdict:
    """Poison D with NaN, launch once, wait, and compare D with `ref`.

    Raises:
        RuntimeError: a CUDA error surfaced at the synchronization.
    """
    ops.d.fill_(float("nan"))
    launch()
    if ops.d.is_cuda:
        torch.cuda.synchronize(ops.d.device)
    return compare(ops.d, ref, ops.problem.dtype_d)
