"""The MoE experts layer's glue: routing on the device, the gather of token rows into routed
rows, the combine of routed rows back to tokens (`cutlass_tune.runtime._moe` holds the layer).

S = tokens x top_k routed rows; slot s = t * top_k + j is token t's j-th expert.

- `moe_routing`: a stable sort of the S expert ids gives the permutation (routed row r holds
  slot perm[r]) and its inverse (slot s is routed row inv[s]); `searchsorted` of the sorted ids
  gives the grouped GEMM's int32 cumulative row ends. No host sync, and no size depends on the
  ids: CUDA graphs capture it.
- `moe_gather`: routed row inv[s] = w[s] * x[s // top_k] (w one by default).
- `moe_combine`: out[t] = sum_j w[t, j] * y[inv[t * top_k + j]], one deterministic pass (no
  atomics; fp32 accumulation).

Gather and combine are each other's adjoint: the gather's backward is a combine, the combine's
a gather scaled by the weights, and the weights' gradient <a[t], b[inv[t * top_k + j]]> is one
function for both (`weights_grad`). Where the native extension is built
(`cutlass_tune/native/moe.cu`: `torch.ops.cutlass_tune.moe_gather`, `.moe_combine`,
`.moe_weights_grad`) CUDA tensors take its kernels, with the fakes registered here
(`register_native`) and the autograd of gather and combine in C++ (`native/ops.cpp`, the formula
of `_setup` and `_op_backward` below, which register only for operators without it); elsewhere
torch ops compute the same values (index_select, a weighted sum over top_k in fp32), deterministic
too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

# ---------------------------------------------------------------------------------------------
# Routing


class MoERouting(NamedTuple):
    """Where each routed row comes from and goes (S = tokens x top_k, slot s = t * top_k + j)."""

    sorted_ids: torch.Tensor
    """S expert ids in routed-row order (stable: a token's rows of one expert in token order)."""
    perm: torch.Tensor
    """S int64: routed row r holds slot perm[r]."""
    inv: torch.Tensor
    """S int64: slot s is routed row inv[s]."""
    offsets: torch.Tensor
    """E int32 cumulative row ends (expert e has routed rows offsets[e-1]:offsets[e]); ids of
    E or more (expert-parallel sentinels) sort last, past offsets[-1]."""
    top_k: int

    @property
    def counts(self) -> torch.Tensor:
        """E int32: each expert's routed rows."""
        return torch.diff(self.offsets, prepend=self.offsets.new_zeros(1))


def moe_routing(top_k_index: torch.Tensor, num_experts: int) -> MoERouting:
    """The routing of `top_k_index` (tokens x top_k expert ids) over `num_experts` experts,
    computed on its device with no host sync (CUDA-graph safe; no size depends on the ids).

    On CUDA where the native library has it, one operator (`moe_route`: a stable counting sort in
    three launches); else torch's stable sort, searchsorted and scatter. The two give the same
    routing for ids in [0, num_experts); ids past it (another rank's experts) sort last either way,
    in slot order there and by id in torch's (rows no GEMM reads)."""
    top_k = top_k_index.shape[-1]
    ids = top_k_index.reshape(-1)
    route = _native.get("moe_route") if ids.is_cuda else None
    if route is not None and num_experts <= ROUTE_MAX_EXPERTS and ids.dtype in (torch.int64, torch.int32):
        sorted_ids, perm, inv, offsets = route(ids, num_experts)
        return MoERouting(sorted_ids, perm, inv, offsets, top_k)
    return torch_routing(top_k_index, num_experts)


def torch_routing(top_k_index: torch.Tensor, num_experts: int) -> MoERouting:
    """`moe_routing` by torch ops: a stable sort of the ids, searchsorted, a scatter."""
    top_k = top_k_index.shape[-1]
    ids = top_k_index.reshape(-1)
    sorted_ids, perm = torch.sort(ids, stable=True)
    experts = torch.arange(num_experts, device=ids.device, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)
    inv = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.shape[0], device=perm.device))
    return MoERouting(sorted_ids, perm, inv, offsets, top_k)


def slot_routing(top_k_index: torch.Tensor) -> MoERouting:
    """The routing that keeps slot order (routed row s is slot s): what rows computed per slot,
    unsorted (the batched GEMMs' rows), take to `moe_combine`. No offsets (no grouped GEMM)."""
    slots = torch.arange(top_k_index.numel(), device=top_k_index.device)
    return MoERouting(top_k_index.reshape(-1), slots, slots, slots.new_empty(0, dtype=torch.int32),
                      top_k_index.shape[-1])


# ---------------------------------------------------------------------------------------------
# Gather and combine: torch's computation, the native kernels, autograd

NATIVE_OPS = ("moe_gather", "moe_combine", "moe_weights_grad")
"""The native extension's MoE operators (cutlass_tune/native/moe.cu); its routing operator
`moe_route` is taken where it is there too."""
ROUTE_MAX_EXPERTS = 1599
"""The most experts `moe_route` takes (its kernels' table of warps x experts in 200 KiB of shared
memory); more route with torch's sort."""


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    """The type sums over `dtype` run in: float32, or float64 for float64 (gradcheck's)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# The weighted forms multiply a row of y's type by float32 weights: type promotion computes the
# product in float32 as it reads the row (no float32 copy of the rows is written first).


def _torch_gather(x: torch.Tensor, perm: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor | None,
                  top_k: int) -> torch.Tensor:
    rows = x.index_select(0, torch.div(perm, top_k, rounding_mode="floor"))
    if weights is None:
        return rows
    scale = weights.reshape(-1).index_select(0, perm).to(_accumulation(x.dtype)).unsqueeze(-1)
    return (rows * scale).to(x.dtype)


def _torch_combine(y: torch.Tensor, perm: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor | None,
                   top_k: int) -> torch.Tensor:
    rows = y.index_select(0, inv).view(-1, top_k, y.shape[-1])
    acc = _accumulation(y.dtype)
    if weights is None:
        return rows.sum(dim=1, dtype=acc).to(y.dtype)
    return (rows * weights.reshape(-1, top_k, 1).to(acc)).sum(dim=1).to(y.dtype)


def _torch_weights_grad(a: torch.Tensor, b: torch.Tensor, inv: torch.Tensor, top_k: int) -> torch.Tensor:
    acc = _accumulation(b.dtype)
    rows = b.index_select(0, inv).view(-1, top_k, b.shape[-1]).to(acc)
    return (rows * a.to(acc).unsqueeze(1)).sum(dim=-1)


_native: dict[str, Any] = {}
"""The native operators by name, where the extension registered all of `NATIVE_OPS`."""


_looked_again: list[bool] = []
"""Whether the native operators were looked for again at the first CUDA call (an extension
loaded after this module's import registers them then)."""


def look_again() -> None:
    """Look for the native operators once more, the first time a CUDA call finds none (an
    extension loaded after this module's import registers them then); later calls do nothing."""
    if not _native and not _looked_again:
        _looked_again.append(True)
        _load_native()


def _native_op(name: str, t: torch.Tensor, weights: torch.Tensor | None = None) -> Any:
    """The native operator `name` for CUDA tensors (its weights are float32), else None."""
    if not t.is_cuda or (weights is not None and weights.dtype != torch.float32):
        return None
    if not _native and not _looked_again and not torch.compiler.is_compiling():
        look_again()
    return _native.get(name)


def gather_rows(x: torch.Tensor, perm: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor | None,
                top_k: int) -> torch.Tensor:
    """Routed row inv[s] = weights[s] * x[s // top_k] (weights None: one), no autograd."""
    op = _native_op("moe_gather", x, weights)
    return op(x, inv, weights, top_k) if op is not None else _torch_gather(x, perm, inv, weights, top_k)


def combine_rows(y: torch.Tensor, perm: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor | None,
                 top_k: int) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * y[inv[t * top_k + j]] in fp32, y's type (weights None:
    one), no autograd."""
    op = _native_op("moe_combine", y, weights)
    return op(y, inv, weights, top_k) if op is not None else _torch_combine(y, perm, inv, weights, top_k)


def weights_grad(a: torch.Tensor, b: torch.Tensor, inv: torch.Tensor, top_k: int) -> torch.Tensor:
    """g[t, j] = <a[t], b[inv[t * top_k + j]]> in fp32 (tokens x top_k float32): the routing
    weights' gradient of a combine (a = d out, b = y) and of a weighted gather (a = x, b = d rows)."""
    op = _native_op("moe_weights_grad", a)
    return op(a, b, inv, top_k) if op is not None else _torch_weights_grad(a, b, inv, top_k)


class _Rows(torch.autograd.Function):
    """The gather (`combine` False) or the combine of rows, each the other's backward; the
    weights' gradient is `weights_grad` with the token-side tensor first. The torch path's
    autograd (the native operators carry their own)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, weights: torch.Tensor | None, perm: torch.Tensor, inv: torch.Tensor,
                top_k: int, combine: bool) -> torch.Tensor:
        ctx.top_k, ctx.combine = top_k, combine
        ctx.save_for_backward(t if weights is not None and ctx.needs_input_grad[1] else None, weights, perm, inv)
        return (combine_rows if combine else gather_rows)(t, perm, inv, weights, top_k)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        t, weights, perm, inv = ctx.saved_tensors
        grad = grad.contiguous()
        adjoint = gather_rows if ctx.combine else combine_rows
        d_t = adjoint(grad, perm, inv, weights, ctx.top_k) if ctx.needs_input_grad[0] else None
        d_w = None
        if t is not None:
            tokens, rows = (grad, t) if ctx.combine else (t, grad)
            d_w = weights_grad(tokens, rows, inv, ctx.top_k)
        return d_t, d_w, None, None, None, None


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _weights(weights: torch.Tensor | None) -> torch.Tensor | None:
    """Routing weights as the sums take them: float32 (float64 kept)."""
    if weights is None or weights.dtype in (torch.float32, torch.float64):
        return weights
    return weights.float()


def moe_gather(x: torch.Tensor, routing: MoERouting, weights: torch.Tensor | None = None) -> torch.Tensor:
    """x's token rows in routed order: row inv[t * top_k + j] = weights[t, j] * x[t] (S x H, x's
    type; weights tokens x top_k, applied in float32; None: one). Differentiable in x and
    weights; its backward is a combine (deterministic: no atomics)."""
    weights = _weights(weights)
    op = _native_op("moe_gather", x, weights)
    if op is not None:  # differentiable itself (the library's C++ autograd)
        return op(x, routing.inv, weights, routing.top_k)
    if _needs_grad(x, weights):
        return _Rows.apply(x, weights, routing.perm, routing.inv, routing.top_k, False)
    return _torch_gather(x, routing.perm, routing.inv, weights, routing.top_k)


def moe_combine(y: torch.Tensor, routing: MoERouting, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Routed rows back to tokens: out[t] = sum_j weights[t, j] * y[inv[t * top_k + j]] in fp32,
    in one deterministic pass (tokens x H, y's type; weights tokens x top_k, applied in float32;
    None: one). Differentiable in y and weights."""
    weights = _weights(weights)
    op = _native_op("moe_combine", y, weights)
    if op is not None:  # differentiable itself (the library's C++ autograd)
        return op(y, routing.inv, weights, routing.top_k)
    if _needs_grad(y, weights):
        return _Rows.apply(y, weights, routing.perm, routing.inv, routing.top_k, True)
    return _torch_combine(y, routing.perm, routing.inv, weights, routing.top_k)


def _fake_rows(x: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor | None, top_k: int) -> torch.Tensor:
    from . import _lowering  # its lowering, as every operator's fake registers its own

    _lowering.ensure("moe_gather")
    return x.new_empty((inv.shape[0], x.shape[-1]))


def _fake_tokens(y: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor | None, top_k: int) -> torch.Tensor:
    from . import _lowering

    _lowering.ensure("moe_combine")
    return y.new_empty((inv.shape[0] // top_k, y.shape[-1]))


def _fake_route(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, ...]:
    flat = ids.reshape(-1)
    slots = flat.shape[0]
    return (flat.new_empty(slots), flat.new_empty(slots, dtype=torch.int64), flat.new_empty(slots, dtype=torch.int64),
            flat.new_empty(num_experts, dtype=torch.int32))


def _fake_weights_grad(a: torch.Tensor, b: torch.Tensor, inv: torch.Tensor, top_k: int) -> torch.Tensor:
    return a.new_empty((a.shape[0], top_k), dtype=torch.float32)


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, inv, weights, top_k = inputs
    ctx.top_k = top_k
    ctx.save_for_backward(x if weights is not None and ctx.needs_input_grad[2] else None, inv, weights)


def _op_backward(adjoint: Callable[..., torch.Tensor], combine: bool) -> Callable[..., tuple]:
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, inv, weights = ctx.saved_tensors
        grad = grad.contiguous()
        d_x = adjoint(grad, inv, weights, ctx.top_k) if ctx.needs_input_grad[0] else None
        d_w = None
        if x is not None:
            tokens, rows = (grad, x) if combine else (x, grad)
            d_w = weights_grad(tokens, rows, inv, ctx.top_k)
        return d_x, None, d_w, None
    return backward


def has_autograd(qualname: str) -> bool:
    """Whether the operator `qualname` ("namespace::name") has a kernel at the Autograd key: the
    native library's C++ one for moe_gather and moe_combine (native/ops.cpp), or one registered
    here before."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Autograd")


def register_native(namespace: str = "cutlass_tune") -> bool:
    """Find the native MoE operators in `torch.ops.<namespace>`, register their fake
    implementations and, where the library registered none in C++, their autograd (so
    torch.compile traces them with no graph break, and a direct call is differentiable), and let
    CUDA tensors take them. Idempotent. Returns whether all of `NATIVE_OPS` were found."""
    ops = getattr(torch.ops, namespace)
    found = {name: getattr(ops, name) for name in NATIVE_OPS if hasattr(ops, name)}
    if len(found) != len(NATIVE_OPS):
        return False
    if _native.get("namespace") == namespace:
        return True
    fakes = {"moe_gather": _fake_rows, "moe_combine": _fake_tokens, "moe_weights_grad": _fake_weights_grad}
    for name, fake in fakes.items():
        torch.library.register_fake(f"{namespace}::{name}", fake)
    if hasattr(ops, "moe_route"):
        torch.library.register_fake(f"{namespace}::moe_route", _fake_route)
        found["moe_route"] = ops.moe_route
    gather, combine = found["moe_gather"], found["moe_combine"]
    for name, backward in (("moe_gather", _op_backward(combine, combine=False)),
                           ("moe_combine", _op_backward(gather, combine=True))):
        if not has_autograd(f"{namespace}::{name}"):
            torch.library.register_autograd(f"{namespace}::{name}", backward, setup_context=_setup)
    _native.clear()
    _native.update(found, namespace=namespace)
    return True


def _load_native() -> bool:
    """The native extension's MoE operators, where its library is built and loads
    (`runtime._native.load`, which the operators' modules call first)."""
    from . import _native as library

    library.load()
    return register_native()


def native_available() -> bool:
    """Whether CUDA tensors take the native gather and combine kernels."""
    return bool(_native)


_load_native()
