"""The enums' torch counterparts, declared once: dtypes both ways, each activation as torch
computes it, differentiates it and names its op (all from `space.ACTIVATIONS`), and each
epilogue node as torch computes and differentiates it (`NODE_TORCH`, `NODE_GRAD`).

The bench stage (operands, references, baselines), the runtime (matmul, its operators, patch)
and capture (a model's aten ops read back as problems) all translate through here, so a new
`DType` or `Activation` has one place to meet torch. Imports torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence

import torch
import torch.nn.functional as F

from .space import (
    ACTIVATIONS,
    GLU_BLOCK,
    Activation,
    ActivationFacets,
    Broadcast,
    DType,
    Node,
    NodeKind,
    Pair,
    activation_of_aten,
)

TORCH_DTYPE: Mapping[DType, torch.dtype] = {
    DType.BF16: torch.bfloat16,
    DType.F16: torch.float16,
    DType.F32: torch.float32,
    DType.E4M3: torch.float8_e4m3fn,
    DType.E5M2: torch.float8_e5m2,
}
"""Every `DType` as a torch.dtype."""

DTYPE_OF: Mapping[torch.dtype, DType] = {t: d for d, t in TORCH_DTYPE.items()}
"""The `DType` of each torch.dtype that has one."""

FP8_DTYPES = frozenset(t for d, t in TORCH_DTYPE.items() if d.is_fp8)
"""torch's fp8 dtypes among `TORCH_DTYPE`'s."""


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _function(facets: ActivationFacets) -> Callable[[torch.Tensor], torch.Tensor]:
    if not facets.torch:
        return _identity
    fn = getattr(F, facets.torch)
    return functools.partial(fn, **dict(facets.kwargs)) if facets.kwargs else fn


def _gradient(facets: ActivationFacets) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    op = getattr(torch.ops.aten, facets.backward)
    args, kwargs = facets.backward_args, dict(facets.backward_kwargs)
    return lambda grad, z: op(grad, z, *args, **kwargs)


ACTIVATION: Mapping[Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    activation: _function(facets) for activation, facets in ACTIVATIONS.items()}
"""Each activation as torch computes it (`ActivationFacets.torch`): what the fused kernels are
verified against, what the torch baselines apply, and what the runtime runs where no kernel fuses it."""

ACTIVATION_BY_NAME: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = {
    activation.value: function for activation, function in ACTIVATION.items()}
"""`ACTIVATION` by the activation's name: for code torch.compile traces on plain values (a
lookup by string guards one dict entry; one by enum member guards the member's identity too)."""

ACTIVATION_GRAD: Mapping[Activation, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    activation: _gradient(facets) for activation, facets in ACTIVATIONS.items() if facets.backward}
"""d activation(z) / dz times the incoming gradient, as torch's own backward computes it
(`ActivationFacets.backward`); every activation but NONE."""


def activation_of_op(op: str, approximate: str = "none") -> Activation | None:
    """The activation the aten op named `op` ("relu", "gelu_", ...; in place or not) applies
    to its first argument, `approximate` being gelu's argument; None for any other op."""
    return activation_of_aten(op, {"approximate": approximate})


EpilogueInputs = Mapping[str, "torch.Tensor | float | None"]
"""An epilogue's operands by name (`space.Operand.name`: "bias", "c", "row_scale", fp8's "scale_a"
and "scale_b") and its scalars ("alpha", "beta"); one it lacks is None or absent."""


def _pass(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    return value


def _scale(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    for name in ("alpha", "scale_a", "scale_b"):
        s = inputs.get(name)
        if s is not None and not (isinstance(s, float) and s == 1.0):
            value = value * s
    return value


def _bias(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    bias = inputs["bias"]
    assert isinstance(bias, torch.Tensor)
    return value + (bias if node.broadcast is Broadcast.COLUMN else bias[:, None])


def _residual(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    c, beta = inputs["c"], inputs.get("beta")
    assert isinstance(c, torch.Tensor) and not isinstance(beta, torch.Tensor)
    return torch.add(value, c, alpha=1.0 if beta is None else beta)


def _activation(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    return ACTIVATION[node.activation](value)


def _gate(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    gate = inputs["c"]
    assert isinstance(gate, torch.Tensor)
    return ACTIVATION[node.activation](gate) * value


def glu_halves(value: torch.Tensor, pair: Pair) -> tuple[torch.Tensor, torch.Tensor]:
    """A GLU pair's gate and up columns of `value` (M x N), each M x N/2 (`space.Pair`)."""
    m, n = value.shape
    if pair is Pair.SPLIT:
        return value[:, : n // 2], value[:, n // 2:]
    blocks = value.reshape(m, n // (2 * GLU_BLOCK), 2, GLU_BLOCK)
    return blocks[:, :, 0].reshape(m, n // 2), blocks[:, :, 1].reshape(m, n // 2)


def _glu(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    gate, up = glu_halves(value, node.pair)
    return ACTIVATION[node.activation](gate) * up


def _row_scale(node: Node, value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    scale = inputs["row_scale"]
    assert isinstance(scale, torch.Tensor)
    return value * scale[:, None]


NODE_TORCH: Mapping[NodeKind, Callable[[Node, torch.Tensor, EpilogueInputs], torch.Tensor]] = {
    NodeKind.ACCUMULATOR: _pass,
    NodeKind.SCALE: _scale,
    NodeKind.BIAS: _bias,
    NodeKind.RESIDUAL: _residual,
    NodeKind.ACTIVATION: _activation,
    NodeKind.GATE: _gate,
    NodeKind.GLU: _glu,
    NodeKind.ROW_SCALE: _row_scale,
}
"""Each node kind as torch computes it, from its input's value and the epilogue's operands:
in float32 on float32 operands it is the fp32 reference (bench), in the output type torch's
fallback (`runtime.torch_gemm`)."""


def apply_nodes(nodes: Sequence[Node], value: torch.Tensor, inputs: EpilogueInputs) -> torch.Tensor:
    """`nodes` (a part of an epilogue's tree, in its order) applied to `value`, the value of the
    node before them (`NODE_TORCH`)."""
    for node in nodes:
        value = NODE_TORCH[node.kind](node, value, inputs)
    return value


Grads = dict[str, torch.Tensor]
_NodeGrad = Callable[[Node, torch.Tensor, Callable[[], torch.Tensor], EpilogueInputs, Collection[str]],
                     tuple[torch.Tensor, Grads]]


def _pass_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
               needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    return grad, {}


def _scale_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
                needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    return _scale(node, grad, inputs), {}


def _bias_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
               needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    if "bias" not in needs:
        return grad, {}
    return grad, {"bias": grad.sum(0) if node.broadcast is Broadcast.COLUMN else grad.sum(1)}


def _residual_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
                   needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    beta = inputs.get("beta")
    return grad, ({"c": grad if beta is None or beta == 1.0 else grad * beta} if "c" in needs else {})


def _activation_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
                     needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    return ACTIVATION_GRAD[node.activation](grad, value()), {}


def _act_grad(activation: Activation, grad: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return grad if activation is Activation.NONE else ACTIVATION_GRAD[activation](grad, z)


def _gate_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
               needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    gate = inputs["c"]
    assert isinstance(gate, torch.Tensor)
    grads = {"c": _act_grad(node.activation, grad * value(), gate)} if "c" in needs else {}
    return grad * ACTIVATION[node.activation](gate), grads


def _glu_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
              needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    z = value()
    gate, up = glu_halves(z, node.pair)
    out = torch.empty_like(z)
    grad_gate, grad_up = glu_halves(out, node.pair)
    if node.pair is Pair.SPLIT:  # views of `out`: written in place
        grad_gate.copy_(_act_grad(node.activation, grad * up, gate))
        grad_up.copy_(grad * ACTIVATION[node.activation](gate))
        return out, {}
    blocks = out.reshape(z.shape[0], -1, 2, GLU_BLOCK)
    blocks[:, :, 0] = _act_grad(node.activation, grad * up, gate).reshape(z.shape[0], -1, GLU_BLOCK)
    blocks[:, :, 1] = (grad * ACTIVATION[node.activation](gate)).reshape(z.shape[0], -1, GLU_BLOCK)
    return out, {}


def _row_scale_grad(node: Node, grad: torch.Tensor, value: Callable[[], torch.Tensor], inputs: EpilogueInputs,
                    needs: Collection[str]) -> tuple[torch.Tensor, Grads]:
    scale = inputs["row_scale"]
    assert isinstance(scale, torch.Tensor)
    grads = {"row_scale": (grad * value()).sum(1)} if "row_scale" in needs else {}
    return grad * scale[:, None], grads


NODE_GRAD: Mapping[NodeKind, _NodeGrad] = {
    NodeKind.ACCUMULATOR: _pass_grad,
    NodeKind.SCALE: _scale_grad,
    NodeKind.BIAS: _bias_grad,
    NodeKind.RESIDUAL: _residual_grad,
    NodeKind.ACTIVATION: _activation_grad,
    NodeKind.GATE: _gate_grad,
    NodeKind.GLU: _glu_grad,
    NodeKind.ROW_SCALE: _row_scale_grad,
}
"""Each node kind's backward: from the gradient of its output, its input's value (a function:
recomputed only where needed) and the operands, the gradient of its input and of the operands
named in `needs`."""


def backward_nodes(nodes: Sequence[Node], grad: torch.Tensor, first: Callable[[], torch.Tensor],
                   inputs: EpilogueInputs, needs: Collection[str] = ()) -> tuple[torch.Tensor, Grads]:
    """The gradient through `nodes` (a part of an epilogue's tree, in its order, applied to the
    value `first()`, computed only where a node needs its input's value) of the gradient `grad`
    of their output: the gradient of `first()`'s value and of the operands named in `needs`."""
    values: dict[int, torch.Tensor] = {}

    def value(i: int) -> torch.Tensor:
        if i not in values:
            values[i] = first() if i == 0 else NODE_TORCH[nodes[i - 1].kind](nodes[i - 1], value(i - 1), inputs)
        return values[i]

    grads: Grads = {}
    for i in reversed(range(len(nodes))):
        grad, found = NODE_GRAD[nodes[i].kind](nodes[i], grad, functools.partial(value, i), inputs, needs)
        grads.update(found)
    return grad, grads


BLOCKWISE_GROUP = 128
"""Block-wise fp8 scaling's group: A's 1 x 128, B's 128 x 128 (`Scaling.BLOCKWISE`)."""


@functools.cache
def blockwise_scaled_mm(device: torch.device) -> bool:
    """Whether this torch's `_scaled_mm` takes block-wise scales (1x128 A, 128x128 B) on
    `device`: torch 2.9+ with cuBLAS 12.9+ on SM90. Found by one tiny call, once per device."""
    a = torch.zeros((16, 2 * BLOCKWISE_GROUP), dtype=torch.float8_e4m3fn, device=device)
    b = torch.zeros((2 * BLOCKWISE_GROUP, 2 * BLOCKWISE_GROUP), dtype=torch.float8_e4m3fn, device=device)
    scale_a = torch.ones((2, 16), dtype=torch.float32, device=device).t()
    scale_b = torch.ones((2, 2), dtype=torch.float32, device=device).t()
    try:
        torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16)
    except (RuntimeError, ValueError, NotImplementedError):
        return False
    return True


SCALED_MM_K_BLOCKS = 4
"""torch's block-wise `_scaled_mm` computes right only where K/128 is a multiple of this."""


def blockwise_scaled_mm_for(device: torch.device, k: int) -> bool:
    """Whether torch's block-wise `_scaled_mm` computes a GEMM of inner size `k` on `device`: it
    takes block-wise scales there (`blockwise_scaled_mm`) and K/128 is a multiple of
    `SCALED_MM_K_BLOCKS`. Otherwise torch 2.11 (cuBLAS of CUDA 13.0) on an H200 returns wrong
    results without an error: relative error 0.42-0.53 at K 640, 768, 1152 and 1.4e3 at
    2048x2048x768, against 3e-3 at K 1024 and 2048 (benchmarks/fp8.md)."""
    return blockwise_scaled_mm(device) and (k // BLOCKWISE_GROUP) % SCALED_MM_K_BLOCKS == 0


def _blocks(scale: torch.Tensor, rows_per_block: int, rows: int, cols: int) -> torch.Tensor:
    return scale.repeat_interleave(rows_per_block, 0).repeat_interleave(BLOCKWISE_GROUP, 1)[:rows, :cols]


def blockwise_dequantized_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                             out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b of block-wise scaled fp8 (`a` M x K, `b` K x N, the scales as `torch._scaled_mm`
    takes them: (M, K/128) and (K/128, N/128)) where `_scaled_mm` has no block-wise path: both
    operands dequantized to bf16, then torch.matmul, + bias."""
    m, k = a.shape
    n = b.shape[1]
    a16 = (a.float() * _blocks(scale_a, 1, m, k)).to(torch.bfloat16)
    b16 = (b.t().float() * _blocks(scale_b.t(), BLOCKWISE_GROUP, n, k)).to(torch.bfloat16).t()
    y = torch.matmul(a16, b16)
    if bias is not None:
        y = y + bias
    return y.to(out_dtype)


def blockwise_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """torch's best path for block-wise scaled fp8: `_scaled_mm` where it computes these
    (`blockwise_scaled_mm_for`), else `blockwise_dequantized_mm`."""
    if not blockwise_scaled_mm_for(a.device, a.shape[1]):
        return blockwise_dequantized_mm(a, b, scale_a, scale_b, out_dtype, bias)
    y = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    return y if bias is None else y + bias  # not every torch takes a bias with these scales


def dequantize_blockwise(q: torch.Tensor, scale: torch.Tensor, rows_per_block: int) -> torch.Tensor:
    """Block-wise scaled fp8 as bfloat16: `q` (..., rows, K) times one scale per `rows_per_block`
    x 128 block (`scale` (..., rows / rows_per_block, K / 128), rounded up), in fp32, rounded to
    bf16 once: what fp8 MoE code without a block-wise grouped GEMM feeds a bf16 grouped GEMM
    (A's 1 x 128 groups with `rows_per_block` 1, B's 128 x 128 blocks with 128)."""
    *lead, rows, k = q.shape
    row_blocks, k_blocks = scale.shape[-2:]
    if rows == row_blocks * rows_per_block and k == k_blocks * BLOCKWISE_GROUP:  # broadcast, no expanded copy
        blocks = q.float().reshape(*lead, row_blocks, rows_per_block, k_blocks, BLOCKWISE_GROUP)
        return blocks.mul_(scale[..., :, None, :, None]).to(torch.bfloat16).reshape(q.shape)
    expanded = scale.repeat_interleave(rows_per_block, -2).repeat_interleave(BLOCKWISE_GROUP, -1)[..., :rows, :k]
    return (q.float() * expanded).to(torch.bfloat16)


def expand_blockwise_scale_b(scale_b: torch.Tensor, n: int, scale_n: int) -> torch.Tensor:
    """B's block-wise scales at granularity `scale_n` along N, as a kernel of that `scale_n`
    (`KernelConfig.scale_n`) reads them: `scale_b` as `torch._scaled_mm` takes it, (K/128,
    N/128) with strides (1, K/128), each scale repeated 128 / `scale_n` times along N, then cut
    to N/`scale_n` (both rounded up), in the same layout: (K/128, N/`scale_n`) with strides
    (1, K/128). The same scale multiplies every element it did, so the products are unchanged.
    `scale_b` itself is returned at 128. A new tensor otherwise: the caller keeps it alive while
    a kernel reads it."""
    if scale_n == BLOCKWISE_GROUP:
        return scale_b
    columns = -(-n // scale_n)
    return scale_b.t().repeat_interleave(BLOCKWISE_GROUP // scale_n, 0)[:columns].contiguous().t()
