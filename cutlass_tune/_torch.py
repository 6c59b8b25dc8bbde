"""The enums' torch counterparts, declared once: dtypes both ways, and each activation as torch
computes it, differentiates it and names its op.

The bench stage (operands, references, baselines), the runtime (matmul, its operators, patch)
and capture (a model's aten ops read back as problems) all translate through here, so a new
`DType` or `Activation` has one place to meet torch. Imports torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from .space import Activation, DType

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


ACTIVATION: Mapping[Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    Activation.NONE: _identity,
    Activation.RELU: F.relu,
    Activation.GELU: F.gelu,
    Activation.GELU_TANH: functools.partial(F.gelu, approximate="tanh"),
    Activation.SILU: F.silu,
}
"""Each activation as torch computes it: what the fused kernels are verified against, what the
torch baselines apply, and what the runtime runs where no kernel fuses it."""

ACTIVATION_GRAD: Mapping[Activation, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    Activation.RELU: lambda grad, z: torch.ops.aten.threshold_backward(grad, z, 0),
    Activation.GELU: lambda grad, z: torch.ops.aten.gelu_backward(grad, z, approximate="none"),
    Activation.GELU_TANH: lambda grad, z: torch.ops.aten.gelu_backward(grad, z, approximate="tanh"),
    Activation.SILU: lambda grad, z: torch.ops.aten.silu_backward(grad, z),
}
"""d activation(z) / dz times the incoming gradient, as torch's own backward computes it."""

_OPS = {"relu": Activation.RELU, "gelu": Activation.GELU, "silu": Activation.SILU}


def activation_of_op(op: str, approximate: str = "none") -> Activation | None:
    """The activation the aten op named `op` ("relu", "gelu_", ...; in place or not) applies
    to its first argument, `approximate` being gelu's argument; None for any other op."""
    found = _OPS.get(op.removesuffix("_"))
    if found is Activation.GELU and approximate == "tanh":
        return Activation.GELU_TANH
    return found


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
