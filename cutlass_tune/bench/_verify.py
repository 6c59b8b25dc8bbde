"""Operands in the storage a `Problem` describes, an fp32 reference, and the correctness check.

A kernel's time counts only after its output, from fresh random inputs into an output
poisoned with NaN, matches the reference: ||out - ref||_F / ||ref||_F within the tolerance of
the output type (looser for fp8 inputs), and no single element further from it than a bound in
units of the reference's RMS. The reference multiplies the same (already rounded)
inputs in fp32, so the error left is accumulation order and precision and the rounding of the
output; the quantization of fp8 inputs is never counted.

A problem with a fused epilogue or fp8 scales gets the operands it reads (C, bias, scales),
random too, and the reference computes the same math in fp32 after the product: activation(s *
(A @ B) + C + bias), with alpha and beta 1 and the activation as torch defines it. A gated
problem's C is a gate's pre-activation instead (normal with D's scale, like a residual) and its
reference activation(C) * (s * (A @ B) + bias). The tolerances stay those of the plain GEMM: the
activations are at most 1.13-Lipschitz (GELU; SiLU 1.10, ReLU 1), so the accumulation error they
pass on grows by at most that factor, while the output's RMS falls to 0.6-0.7 of its input's
(ReLU 0.71, GELU 0.65, SiLU 0.60 over N(0, 1)): the relative errors of a right kernel about
double, still 5x (bf16) and 2x (fp8 fast accumulation at K = 4096) inside the bounds. Rounding
the output stays relative to each element. What the bounds cannot tell apart is GELU's erf form
from its tanh approximation (they differ by at most 4.7e-4, a relative Frobenius 2e-4): tests
compare the two references directly (tests/bench/test_gpu_epilogue.py). A gated output's
relative error is the product's, weighted by the activated gate: its bounds need no change
either.

A grouped problem's operands are the routed rows A (M x K), the experts' weights B (E x N x K,
or E x K x N) and the int32 row offsets; its reference multiplies each expert's rows by that
expert's weight, and each expert's rows are checked on their own (`compare_groups`), against
the same bounds relative to that expert's reference: a wrong expert cannot hide among right ones.
A block-wise fp8 grouped problem's scales are those of fp8 MoE code: A's M x K/128 row-major
(each routed row's groups together), B's E x N/128 x K/128 (each expert's weight's blocks); its
reference multiplies the dequantized rows by each expert's dequantized weight.

A weight-gradient problem's (`Grouping.GROUPED_K`) operands are the output gradient G (A: M x N
row-major), the input X (B: M x K row-major), both with rows sorted by expert, the same offsets,
and dW (D: E x N x K); its reference is each expert's G_e^T X_e in fp32, zero for an expert
without rows, and each expert's dW_e is checked on its own: an empty expert's must be exactly 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from .._torch import FP8_DTYPES, TORCH_DTYPE, apply_nodes
from ..space import BLOCKWISE_K, DType, Grouping, Inputs, KindRegistry, Layout, Node, NodeKind, Problem, Role, Scaling
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

ROUNDINGS = 4
"""Roundings to the output type an element off by more than `ELEMENT_TOLERANCE` of the RMS may
carry beyond that bound, each of at most half an ulp of its own value: torch's eager path of a
fused epilogue rounds the GEMM's output, the activation and the product (or the bias and residual
adds) one by one. A gated output is a product of two normal-like values, whose largest elements
sit near 20 RMS: three bf16 roundings move such an element by 0.12-0.14 RMS (measured), past the
bound that a single rounding keeps within 0.05. Scaled by the element's own size, this allowance
is 1.6% of the RMS at an RMS-sized element (bf16): a wrong tile, off by about the RMS
everywhere, still fails."""

FP8_ELEMENT_TOLERANCE = 0.25
"""The same bound for fp8 inputs (any output type): their reduced-precision accumulation
leaves single elements off by up to about 2% of their size (about 0.1 RMS at 5 RMS)."""

SCALE_SPREAD = 2.0
"""Scaled fp8 operands come from rows (A) and columns (B) whose magnitudes differ by up to this
factor either way (log-uniform), each quantized by its own amax: a realistic spread of scales."""


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

    A grouped problem's `b` holds the experts' weights one after another: E x N x K (layout_b
    COL) or E x K x N (ROW), `b_kn` being E x K x N; `offsets` holds E int32 cumulative row
    ends on the operands' device (`torch._grouped_mm`'s `offs`), written by `allocate`.

    The epilogue's operands are set where the problem reads them: `c` (M x N row-major, D's
    type) for a residual or a gated problem's gate pre-activation, `bias` (N values, D's type)
    for a bias, and fp32 `scale_a`/`scale_b` for scaled fp8 (shape () each for
    `Scaling.TENSOR`; (M, 1) and (1, N) for ROWCOL, as `torch._scaled_mm` takes them; for
    BLOCKWISE A's (M, K/128) with strides (1, M) and B's (K/128, N/128) with strides (1, K/128),
    the transpose of the weight's contiguous (N/128, K/128), as `torch._scaled_mm` takes them on
    SM90 and the kernel reads them). A grouped BLOCKWISE problem's are K-major instead, as MoE
    code quantizes them and the grouped kernel reads them: A's (M, K/128) row-major, B's (E,
    N/128, K/128) contiguous (`grouped_blockwise_scales`).
    """

    problem: Problem
    a: torch.Tensor
    b: torch.Tensor
    d: torch.Tensor
    c: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    scale_a: torch.Tensor | None = None
    scale_b: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    row_scale: torch.Tensor | None = None
    """M fp32 values in [0, 1), one per row of D (routing weights), for the declared `row_scale`
    node; not among `inputs` until the ABI passes it to a kernel."""

    @property
    def a_mk(self) -> torch.Tensor:
        return self.a if self.problem.layout_a is Layout.ROW else self.a.t()

    @property
    def b_kn(self) -> torch.Tensor:
        return self.b.transpose(-2, -1) if self.problem.layout_b is Layout.COL else self.b

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        """The tensors the GEMM reads, by field name: A, B, those of the epilogue it has and a
        grouped problem's offsets."""
        return {name: t for name in _INPUTS if (t := getattr(self, name)) is not None}

    @property
    def nbytes(self) -> int:
        """Bytes one GEMM reads and writes: its inputs and D."""
        return sum(t.numel() * t.element_size() for t in (*self.inputs.values(), self.d))

    def copy(self) -> Operands:
        """Operands in new storage: every input with the same values, D uninitialized."""
        def clone(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.clone()
        return Operands(problem=self.problem, a=self.a.clone(), b=self.b.clone(), d=torch.empty_like(self.d),
                        c=clone(self.c), bias=clone(self.bias), scale_a=clone(self.scale_a),
                        scale_b=clone(self.scale_b), offsets=clone(self.offsets), row_scale=clone(self.row_scale))


_INPUTS = ("a", "b", "c", "bias", "scale_a", "scale_b", "offsets")


def group_bounds(problem: Problem) -> list[tuple[int, int]]:
    """(first row, end row) of each expert of a grouped problem, in expert order."""
    bounds, end = [], 0
    for rows in problem.group_rows:
        bounds.append((end, end + rows))
        end += rows
    return bounds


def group_offsets(problem: Problem, device: torch.device | str) -> torch.Tensor:
    """A grouped problem's E int32 cumulative row ends on `device`."""
    return torch.tensor([end for _, end in group_bounds(problem)], dtype=torch.int32, device=device)


@dataclasses.dataclass(frozen=True)
class Grouped:
    """How a grouping lays out and checks its operands (`GROUPINGS`): the weights' shape from
    one weight's, the row offsets on the device (None for a single GEMM), and the comparison
    of an output with its reference."""

    weights: Callable[[Problem, tuple[int, ...]], tuple[int, ...]]
    offsets: Callable[[Problem, torch.device | str], torch.Tensor | None]
    compare: Callable[[torch.Tensor, torch.Tensor, Problem], Verdict]
    shapes: Callable[[Problem], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] | None = None
    """The shapes of A, B and D where they are not the GEMM's (A M x K, B from `weights`, D M x N)."""


GROUPINGS: KindRegistry[Grouped] = KindRegistry("operand layout")
"""Each grouping's operands and check, by the kind's grouping."""

SCALES: KindRegistry[Callable[[Problem, torch.device | str], tuple[torch.Tensor, torch.Tensor] | None]] = \
    KindRegistry("scale operands")
"""Uninitialized fp32 scales of A and B for each kind (None where it has none)."""

FILLS: KindRegistry[Callable[[Operands, torch.Generator], None]] = KindRegistry("input fill")
"""How each kind's A, B (and scales) are filled with random values (`randomize`)."""


def allocate(problem: Problem, device: torch.device | str) -> Operands:
    """Uninitialized operands for `problem` on `device`."""
    p = problem
    a_shape: tuple[int, ...] = (p.m, p.k) if p.layout_a is Layout.ROW else (p.k, p.m)
    b_shape: tuple[int, ...] = (p.n, p.k) if p.layout_b is Layout.COL else (p.k, p.n)
    grouped = GROUPINGS[p.kind]
    d_type = TORCH_DTYPE[p.dtype_d]
    b_shape = grouped.weights(p, b_shape)
    d_shape: tuple[int, ...] = p.epilogue.output_shape(p.m, p.n)
    if grouped.shapes is not None:
        a_shape, b_shape, d_shape = grouped.shapes(p)
    scales = SCALES[p.kind](p, device)
    extra = {o.name: torch.empty(o.shape, dtype=d_type if o.role is Role.D else torch.float32, device=device)
             for o in p.epilogue.operands(p.m, p.n)}
    return Operands(
        problem=p,
        a=torch.empty(a_shape, dtype=TORCH_DTYPE[p.dtype_a], device=device),
        b=torch.empty(b_shape, dtype=TORCH_DTYPE[p.dtype_b], device=device),
        d=torch.empty(d_shape, dtype=d_type, device=device),
        c=extra.get("c"),
        bias=extra.get("bias"),
        scale_a=scales[0] if scales else None,
        scale_b=scales[1] if scales else None,
        offsets=grouped.offsets(p, device),
        row_scale=extra.get("row_scale"),
    )


@SCALES.register()
def _epilogue_scales(p: Problem, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The scales an epilogue applies: one fp32 each (TENSOR), or (M, 1) and (1, N) (ROWCOL), as
    `torch._scaled_mm` takes them; None unscaled."""
    shapes = {Scaling.TENSOR: ((), ()), Scaling.ROWCOL: ((p.m, 1), (1, p.n))}.get(p.scaling)
    if shapes is None:
        return None
    return (torch.empty(shapes[0], dtype=torch.float32, device=device),
            torch.empty(shapes[1], dtype=torch.float32, device=device))


SCALES.add(lambda p, device: blockwise_scales(p.m, p.n, p.k, device), grouping=Grouping.NONE,
           inputs=Inputs.FP8_BLOCKWISE)
SCALES.add(lambda p, device: grouped_blockwise_scales(p.m, p.n, p.k, p.groups, device), grouping=Grouping.GROUPED,
           inputs=Inputs.FP8_BLOCKWISE)


def blockwise_scales(m: int, n: int, k: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialized block-wise scales as `torch._scaled_mm` takes them on SM90 and the kernel
    reads them: A's (M, K/128) with strides (1, M), one per 1 x 128 group; B's (K/128, N/128)
    with strides (1, K/128), one per 128 x 128 block (the transpose of the weight's contiguous
    (N/128, K/128) scales)."""
    groups = -(-k // BLOCKWISE_K)
    scale_a = torch.empty((groups, m), dtype=torch.float32, device=device).t()
    scale_b = torch.empty((-(-n // BLOCKWISE_K), groups), dtype=torch.float32, device=device).t()
    return scale_a, scale_b


def grouped_blockwise_scales(m: int, n: int, k: int, groups: int,
                             device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialized block-wise scales of a grouped problem, both K-major as fp8 MoE code keeps
    them and the grouped kernel reads them: A's (M, K/128) row-major, one per 1 x 128 group of a
    routed row; B's (E, N/128, K/128) contiguous, one per 128 x 128 block of each expert's N x K
    weight."""
    k_blocks, n_blocks = -(-k // BLOCKWISE_K), -(-n // BLOCKWISE_K)
    return (torch.empty((m, k_blocks), dtype=torch.float32, device=device),
            torch.empty((groups, n_blocks, k_blocks), dtype=torch.float32, device=device))


def randomize(ops: Operands, generator: torch.Generator) -> None:
    """Fill the inputs with random values.

    A and B: normal values scaled so that D's entries are about N(0, 1) for 16-bit inputs;
    N(0, 1) rounded to fp8 for unscaled fp8 inputs (D's entries about N(0, K)). Scaled fp8
    inputs are quantized as a model does it: rows of A (columns of B) of normal values whose
    scale varies by up to `SCALE_SPREAD` either way, each divided by its amax / 448 (the whole
    matrix's for TENSOR), that quotient stored as fp8 and the divisor as the scale; D's entries
    are about N(0, 1) again. C (a residual or a gate's pre-activation) and the bias are normal
    with D's scale.
    """
    p = ops.problem
    FILLS[p.kind](ops, generator)
    d_scale = float(p.k) ** 0.5 if p.dtype_a.is_fp8 and p.scaling is Scaling.NONE else 1.0
    for extra in (ops.c, ops.bias):
        if extra is not None:
            extra.normal_(0.0, d_scale, generator=generator)
    if ops.row_scale is not None:
        ops.row_scale.uniform_(0.0, 1.0, generator=generator)


@FILLS.register()
def _fill_inputs(ops: Operands, generator: torch.Generator) -> None:
    """A and B, quantized by their scales where the epilogue applies them (TENSOR, ROWCOL)."""
    p = ops.problem
    if ops.scale_a is not None and ops.scale_b is not None:
        _fill_scaled(ops.a_mk, ops.scale_a, generator)
        _fill_scaled(ops.b_kn.t(), ops.scale_b.view(-1, 1) if ops.scale_b.dim() else ops.scale_b, generator)
    else:
        for t in (ops.a, ops.b):
            if t.dtype in FP8_DTYPES:
                _fill_fp8(t, generator)
            else:
                t.normal_(0.0, p.k ** -0.25, generator=generator)


@FILLS.register(grouping=Grouping.NONE, inputs=Inputs.FP8_BLOCKWISE)
def _fill_blockwise_inputs(ops: Operands, generator: torch.Generator) -> None:
    assert ops.scale_a is not None and ops.scale_b is not None
    _fill_blockwise(ops.a_mk, ops.scale_a, 1, generator)
    _fill_blockwise(ops.b_kn.t(), ops.scale_b.t(), BLOCKWISE_K, generator)


@FILLS.register(grouping=Grouping.GROUPED, inputs=Inputs.FP8_BLOCKWISE)
def _fill_grouped_blockwise_inputs(ops: Operands, generator: torch.Generator) -> None:
    assert ops.scale_a is not None and ops.scale_b is not None
    _fill_blockwise(ops.a_mk, ops.scale_a, 1, generator)
    for weight, scale in zip(ops.b_kn.transpose(-2, -1), ops.scale_b):
        _fill_blockwise(weight, scale, BLOCKWISE_K, generator)


@FILLS.register(grouping=Grouping.GROUPED_K)
def _fill_gradient_inputs(ops: Operands, generator: torch.Generator) -> None:
    """G and X normal, scaled so that dW's entries are about N(0, 1) at the mean rows per expert
    (each expert sums its own rows)."""
    p = ops.problem
    sigma = max(1, p.m // max(1, p.groups)) ** -0.25
    for t in (ops.a, ops.b):
        t.normal_(0.0, sigma, generator=generator)


def _fill_scaled(q: torch.Tensor, scale: torch.Tensor, generator: torch.Generator) -> None:
    # q: rows x K (a view into the fp8 storage); scale: (rows, 1) per row, or () for one.
    rows, k = q.shape
    spread = torch.rand((rows, 1), generator=generator, device=q.device).mul_(2).sub_(1)
    sigma = SCALE_SPREAD ** spread * k ** -0.25
    x = torch.randn((rows, k), generator=generator, device=q.device).mul_(sigma)
    limit = torch.finfo(q.dtype).max
    amax = x.abs().amax(dim=1, keepdim=True) if scale.dim() else x.abs().amax()
    scale.copy_(amax / limit)
    q.copy_((x / scale).clamp_(-limit, limit))


def _fill_blockwise(q: torch.Tensor, scale: torch.Tensor, rows_per_block: int, generator: torch.Generator) -> None:
    # q: rows x K (a view into the fp8 storage); scale: (rows / rows_per_block, K / 128), one per
    # block. Each block's values are normal with a size of its own (up to SCALE_SPREAD either
    # way), so blocks' scales differ as an outlier channel's do, and a kernel applying one block's
    # scale to another is wrong by up to SCALE_SPREAD^2.
    rows, k = q.shape
    blocks = scale.shape
    spread = torch.rand(blocks, generator=generator, device=q.device).mul_(2).sub_(1)
    sigma = _expand_blocks(SCALE_SPREAD ** spread * k ** -0.25, rows_per_block, rows, k)
    x = torch.randn((rows, k), generator=generator, device=q.device).mul_(sigma)
    padded = x.new_zeros((blocks[0] * rows_per_block, blocks[1] * BLOCKWISE_K))
    padded[:rows, :k] = x.abs()
    amax = padded.view(blocks[0], rows_per_block, blocks[1], BLOCKWISE_K).amax(dim=(1, 3))
    limit = torch.finfo(q.dtype).max
    scale.copy_(amax / limit)
    q.copy_((x / _expand_blocks(scale, rows_per_block, rows, k)).clamp_(-limit, limit))


def _expand_blocks(per_block: torch.Tensor, rows_per_block: int, rows: int, k: int) -> torch.Tensor:
    """A (row blocks, K blocks) tensor as rows x K, each value over its block."""
    return per_block.repeat_interleave(rows_per_block, 0).repeat_interleave(BLOCKWISE_K, 1)[:rows, :k]


def dequantized(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M x K) and B (K x N) in fp32 with their block-wise scales applied: the math a
    block-wise kernel computes, A's 1 x 128 groups and B's 128 x 128 blocks each times its scale."""
    p = ops.problem
    assert p.scaling is Scaling.BLOCKWISE and ops.scale_a is not None and ops.scale_b is not None
    a = ops.a_mk.float().mul_(_expand_blocks(ops.scale_a, 1, p.m, p.k))
    b = ops.b_kn.t().float().mul_(_expand_blocks(ops.scale_b.t(), BLOCKWISE_K, p.n, p.k))
    return a, b.t()


def _fill_fp8(t: torch.Tensor, generator: torch.Generator) -> None:
    # Unit variance sits in the normal range of both fp8 formats (e4m3: 2^-6 .. 448), where
    # k^-0.25 scaling would push a tenth of the values into subnormals. The clamp keeps values
    # finite: e4m3fn has no infinity, and out-of-range conversions give NaN.
    limit = torch.finfo(t.dtype).max
    values = torch.randn(t.shape, generator=generator, device=t.device, dtype=torch.float32)
    t.copy_(values.clamp_(-limit, limit))


def reference(ops: Operands) -> torch.Tensor:
    """The problem's result in fp32 (IEEE, no TF32) from the stored inputs, as a float32 tensor
    of D's shape: s * (A @ B), s being scale_a * scale_b (1 unscaled), as its kind computes it
    (`REFERENCES`: a grouped problem's, each expert's rows times its weight; experts without rows
    add nothing), then the epilogue's other nodes as torch computes them (`_torch.NODE_TORCH` on
    float32 operands, C entering with beta 1): activation(s * (A @ B) + bias + C) or, gated,
    activation(C) * (s * (A @ B) + bias)."""
    out = REFERENCES[ops.problem.kind](ops)
    nodes = epilogue_tail(ops.problem)
    inputs = {"c": None if ops.c is None else ops.c.float(), "bias": None if ops.bias is None else ops.bias.float(),
              "row_scale": ops.row_scale}
    return apply_nodes(nodes, out, inputs)


_PRODUCT_NODES = (NodeKind.ACCUMULATOR, NodeKind.SCALE)
"""The nodes `reference` computes with its GEMM (the scales multiplied in)."""


def epilogue_tail(problem: Problem) -> list[Node]:
    """The problem's epilogue nodes after its product (`_PRODUCT_NODES`), in the tree's order."""
    return [node for node in problem.epilogue.tree().walk() if node.kind not in _PRODUCT_NODES]

REFERENCES: KindRegistry[Callable[[Operands], torch.Tensor]] = KindRegistry("fp32 product")
"""The fp32 product s * (A @ B) of each kind, before its epilogue (`reference`), by its grouping."""

PRODUCTS: KindRegistry[Callable[[Operands], torch.Tensor]] = KindRegistry("fp32 product")
"""A single GEMM's s * (A @ B) in fp32, before its epilogue, by what the mainloop multiplies."""


@PRODUCTS.register()
def _product(ops: Operands) -> torch.Tensor:
    out = torch.matmul(ops.a_mk.float(), ops.b_kn.float())
    if ops.scale_a is not None and ops.scale_b is not None:
        out.mul_(ops.scale_a).mul_(ops.scale_b)
    return out


@PRODUCTS.register(inputs=Inputs.FP8_BLOCKWISE)
def _blockwise_product(ops: Operands) -> torch.Tensor:
    return torch.matmul(*dequantized(ops))


@REFERENCES.register(grouping=Grouping.NONE)
def _dense_reference(ops: Operands) -> torch.Tensor:
    return PRODUCTS[ops.problem.kind](ops)


@REFERENCES.register(grouping=Grouping.GROUPED)
def _grouped_reference(ops: Operands) -> torch.Tensor:
    # One expert at a time: its weight in fp32 is N x K x 4 bytes (470 MB for Mixtral's), all of
    # them at once several GB.
    p = ops.problem
    a = ops.a_mk.float()
    scale_b = ops.scale_b if p.scaling is Scaling.BLOCKWISE else None
    if scale_b is not None:
        assert ops.scale_a is not None
        a.mul_(_expand_blocks(ops.scale_a, 1, p.m, p.k))
    # The product is M x N; D is narrower where the epilogue pairs columns (a GLU's M x N/2).
    out = torch.empty((p.m, p.n), dtype=torch.float32, device=ops.d.device)
    for expert, (lo, hi) in enumerate(group_bounds(p)):
        if hi > lo:
            weight = ops.b_kn[expert].t().float()  # N x K
            if scale_b is not None:
                weight.mul_(_expand_blocks(scale_b[expert], BLOCKWISE_K, p.n, p.k))
            torch.matmul(a[lo:hi], weight.t(), out=out[lo:hi])
    return out


@REFERENCES.register(grouping=Grouping.GROUPED_K)
def _weight_gradient_reference(ops: Operands) -> torch.Tensor:
    """dW_e = G_e^T X_e of each expert in fp32 (E x N x K), zero for an expert without rows."""
    p = ops.problem
    out = torch.zeros((p.groups, p.n, p.k), dtype=torch.float32, device=ops.d.device)
    for expert, (lo, hi) in enumerate(group_bounds(p)):
        if hi > lo:
            torch.matmul(ops.a[lo:hi].t().float(), ops.b[lo:hi].float(), out=out[expert])
    return out


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
    `element_tolerance(dtype, fp8_inputs)` of the reference's RMS beyond `ROUNDINGS` roundings
    of its own value, is a wrong result."""
    bad = out.numel() - int(torch.isfinite(out).sum())
    if bad:
        return Verdict(Status.WRONG_RESULT, None, f"{bad} of {out.numel()} output elements are "
                       "NaN or infinite (left unwritten, or overflowed)")
    diff = out.float() - ref
    ref_norm = torch.linalg.vector_norm(ref)
    err = float(torch.linalg.vector_norm(diff) / ref_norm)
    rms = ref_norm / ref.numel() ** 0.5
    diff.abs_()
    worst = float(diff.max() / rms)
    kind = f"a {dtype.value} output" + (" from fp8 inputs" if fp8_inputs else "")
    tol = tolerance(dtype, fp8_inputs)
    if not err <= tol:
        return Verdict(Status.WRONG_RESULT, err, f"relative error {err:.3g} exceeds {tol:g} allowed for {kind}",
                       worst)
    element_tol = element_tolerance(dtype, fp8_inputs)
    if not worst <= element_tol:  # beyond the bound itself: is it beyond its own roundings too?
        excess = diff.sub_(ref.abs(), alpha=ROUNDINGS * torch.finfo(TORCH_DTYPE[dtype]).eps / 2)
        flat = int(excess.argmax())  # in row-major order, whatever the strides
        beyond = float(excess.reshape(-1)[flat] / rms)
        if not beyond <= element_tol:
            row, col = divmod(flat, out.shape[1])
            return Verdict(Status.WRONG_RESULT, err, f"element ({row}, {col}) is off by {beyond:.3g} of the "
                           f"reference's RMS, more than the {element_tol:g} allowed for {kind} (beyond "
                           f"{ROUNDINGS} roundings of its value)", worst)
    return Verdict(Status.OK, err, worst_error=worst)


def compare_groups(out: torch.Tensor, ref: torch.Tensor, problem: Problem) -> Verdict:
    """`compare` of each expert's rows of a grouped problem's output, then of the whole: the
    first expert whose rows fail names the verdict ("expert 5 (rows 640:768): ..."). The figures
    of a right output are the whole's."""
    fp8 = problem.dtype_a.is_fp8 or problem.dtype_b.is_fp8
    for expert, (lo, hi) in enumerate(group_bounds(problem)):
        if hi > lo:
            verdict = compare(out[lo:hi], ref[lo:hi], problem.dtype_d, fp8_inputs=fp8)
            if verdict.status is not Status.OK:
                return dataclasses.replace(verdict, reason=f"expert {expert} (rows {lo}:{hi}): {verdict.reason}")
    return compare(out, ref, problem.dtype_d, fp8_inputs=fp8)


def compare_gradients(out: torch.Tensor, ref: torch.Tensor, problem: Problem) -> Verdict:
    """`compare` of each expert's dW_e (E x N x K) on its own, then of the whole: an expert without
    rows must hold exact zeros ("expert 5 (no rows): 12 of 65536 elements are not 0")."""
    for expert, (lo, hi) in enumerate(group_bounds(problem)):
        if hi == lo:
            nonzero = out[expert].numel() - int((out[expert] == 0).sum())  # NaN is not 0 either
            if nonzero:
                return Verdict(Status.WRONG_RESULT, None, f"expert {expert} (no rows): {nonzero} of "
                               f"{out[expert].numel()} elements are not 0")
        else:
            verdict = compare(out[expert], ref[expert], problem.dtype_d)
            if verdict.status is not Status.OK:
                return dataclasses.replace(verdict, reason=f"expert {expert} (rows {lo}:{hi}): {verdict.reason}")
    return compare(out.reshape(-1, problem.k), ref.reshape(-1, problem.k), problem.dtype_d)


def verify_launch(launch: Callable[[], None], ops: Operands, ref: torch.Tensor) -> Verdict:
    """Poison D with NaN, launch once, wait, and compare D with `ref` (each expert's rows on
    their own for a grouped problem, `compare_groups`).

    Raises:
        RuntimeError: a CUDA error surfaced at the synchronization.
    """
    ops.d.fill_(float("nan"))
    launch()
    if ops.d.is_cuda:
        torch.cuda.synchronize(ops.d.device)
    return GROUPINGS[ops.problem.kind].compare(ops.d, ref, ops.problem)


def _compare_whole(out: torch.Tensor, ref: torch.Tensor, problem: Problem) -> Verdict:
    return compare(out, ref, problem.dtype_d, fp8_inputs=problem.dtype_a.is_fp8 or problem.dtype_b.is_fp8)


GROUPINGS.add(Grouped(weights=lambda p, shape: shape, offsets=lambda p, device: None, compare=_compare_whole),
              grouping=Grouping.NONE)
GROUPINGS.add(Grouped(weights=lambda p, shape: (p.groups, *shape), offsets=group_offsets, compare=compare_groups),
              grouping=Grouping.GROUPED)
GROUPINGS.add(Grouped(weights=lambda p, shape: shape, offsets=group_offsets, compare=compare_gradients,
                      shapes=lambda p: ((p.m, p.n), (p.m, p.k), (p.groups, p.n, p.k))),
              grouping=Grouping.GROUPED_K)
