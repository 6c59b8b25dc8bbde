"""`Fp8Linear`: an inference nn.Linear whose weight is fp8 e4m3 with float32 scales, run by
`matmul`'s scaled fp8 GEMM (`cutlass_tune.nn.Fp8Linear`).

`Fp8Linear.from_linear(linear, table, scaling=...)` quantizes a bf16/fp16 nn.Linear once; each
call quantizes its input the same way and runs one scaled GEMM with the bias fused: the table's
kernel of that scaling on CUDA, torch's path for the same math where it has none (and on the
CPU: torch._scaled_mm row-wise, the dequantized product block-wise). Under torch.compile the GEMM
is the operator `torch.ops.cutlass_tune.scaled_mm` (`scaled_mm_op`): no graph break, the input's
quantization compiled with the model around it, the table read by its key at each call. Two
scalings:

- row-wise ("rowwise", `Scaling.ROWCOL`): one scale per output feature and one per token;
  in_features and out_features multiples of 16 (fp8 TMA alignment, torch._scaled_mm's too).
- block-wise ("blockwise", `Scaling.BLOCKWISE`, DeepSeek-V3's): one scale per 128 x 128 block
  of the weight and per 1 x 128 group of a token; both feature counts multiples of 128.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from .._torch import BLOCKWISE_GROUP
from ..space import Scaling
from ._dispatch import OUT_DTYPES
from ._fp8 import E4M3, quantize_blockwise_activations, quantize_blockwise_weight, quantize_rowwise
from ._matmul import MatmulInputError, matmul, torch_gemm
from ._op import registered_table, scaled_mm_op, table_key
from ._table import BestTable

_SCALINGS = {"rowwise": Scaling.ROWCOL, Scaling.ROWCOL.value: Scaling.ROWCOL,
             Scaling.BLOCKWISE.value: Scaling.BLOCKWISE}
_NAMES = {Scaling.ROWCOL: "rowwise", Scaling.BLOCKWISE: "blockwise"}
_ALIGNMENT = {Scaling.ROWCOL: 16, Scaling.BLOCKWISE: BLOCKWISE_GROUP}
_WHY = {Scaling.ROWCOL: "16 bytes of e4m3, the fp8 GEMMs' alignment",
        Scaling.BLOCKWISE: f"whole {BLOCKWISE_GROUP} x {BLOCKWISE_GROUP} scale blocks"}
BLOCKWISE_ROWS = 4
"""Block-wise calls pad the tokens to a multiple of this: the kernels load A's scales (stride M) by TMA in 16 bytes."""


def scaling_of(value: object) -> Scaling:
    """The scaling an `Fp8Linear` takes, given as `Scaling.ROWCOL` or `Scaling.BLOCKWISE` or a
    name ("rowwise", "rowcol", "blockwise"). Raises MatmulInputError naming them."""
    if isinstance(value, Scaling) and value in _NAMES:
        return value
    found = _SCALINGS.get(value) if isinstance(value, str) else None
    if found is None:
        raise MatmulInputError(f"Fp8Linear scaling {str(value)[:40]!r} is not rowwise or blockwise")
    return found


def _check_features(in_features: int, out_features: int, scaling: Scaling) -> None:
    multiple = _ALIGNMENT[scaling]
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise MatmulInputError(f"Fp8Linear: {name} {str(value)[:40]!r} is not a positive integer")
        if value % multiple:
            raise MatmulInputError(f"Fp8Linear {_NAMES[scaling]}: {name} {value} is not a multiple of {multiple} "
                                   f"({_WHY[scaling]})")


def _unit_scale(in_features: int, out_features: int, scaling: Scaling, device: torch.device | str | None
                ) -> torch.Tensor:
    """The weight_scale buffer of a new module: ones, in the shape and strides `matmul` takes."""
    if scaling is Scaling.ROWCOL:
        return torch.ones(1, out_features, device=device)
    return torch.ones(out_features // BLOCKWISE_GROUP, in_features // BLOCKWISE_GROUP, device=device).t()


def _quantize_rowwise_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, scale = quantize_rowwise(w)
    return q, scale.reshape(1, -1)  # per row of W: per column of b = W.t(), as scale_b


_WEIGHT_QUANTIZERS: dict[Scaling, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    Scaling.ROWCOL: _quantize_rowwise_weight, Scaling.BLOCKWISE: quantize_blockwise_weight}


class Fp8Linear(torch.nn.Module):
    """y = x @ W^T + bias of an fp8 e4m3 weight W, for inference (no gradient).

    state_dict keys: `weight` (out_features x in_features e4m3, row-major, as nn.Linear's),
    `weight_scale` (float32; row-wise (1, out_features): scale_b of W.t(); block-wise
    (in/128, out/128) with strides (1, in/128), the transpose of a contiguous (out/128, in/128):
    torch._scaled_mm's layouts) and `bias` (out_features of `out_dtype`; absent without one).
    W dequantized is weight * the scale of its row (block). Casting the module (`.half()`,
    `.to(dtype)`) casts the fp8 weight too: cast a model before swapping its Linears.

    The forward quantizes x ([..., in_features] of any float type) per call, one scale per
    token (row-wise) or per 1 x 128 group of a token (block-wise), then runs `matmul` (CUDA; under
    torch.compile through its operator, `scaled_mm_op`, with no graph break) or `torch_gemm`
    (elsewhere) with both scales and the bias, and returns [..., out_features] of `out_dtype`.

    Args:
        in_features, out_features, bias, device: as torch.nn.Linear (the weight is e4m3,
            zeros until loaded; weight_scale ones).
        table: the best-config table (a `BestTable`, a path `BestTable.load` reads, or a key
            from `register_table`); only its key is kept, as `cutlass_tune.nn.Linear` does.
        scaling: "rowwise" (`Scaling.ROWCOL`) or "blockwise" (`Scaling.BLOCKWISE`).
        out_dtype: the result's and the bias's type: torch.bfloat16, torch.float16 or torch.float32.

    Raises:
        MatmulInputError: feature counts that are not multiples of 16 (row-wise) or 128
            (block-wise), another scaling or out_dtype.
        UnregisteredTableError: `table` is a string that is neither a registered key nor a
            readable table.
    """

    weight_scale: torch.Tensor

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None, *, table: BestTable | str | Path,
                 scaling: Scaling | str = "rowwise", out_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.scaling = scaling_of(scaling)
        _check_features(in_features, out_features, self.scaling)
        if out_dtype not in OUT_DTYPES:
            raise MatmulInputError(f"Fp8Linear out_dtype {out_dtype} is not torch.bfloat16, torch.float16 or "
                                   "torch.float32")
        self.in_features, self.out_features, self.out_dtype = in_features, out_features, out_dtype
        self.table_key = table_key(table)
        self.weight = torch.nn.Parameter(torch.zeros(out_features, in_features, dtype=E4M3, device=device),
                                         requires_grad=False)
        self.register_buffer("weight_scale", _unit_scale(in_features, out_features, self.scaling, device))
        self.bias: torch.nn.Parameter | None = None
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=out_dtype, device=device),
                                           requires_grad=False)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, table: BestTable | str | Path, *,
                    scaling: Scaling | str = "rowwise", out_dtype: torch.dtype | None = None) -> Fp8Linear:
        """`linear`'s weight quantized to e4m3 by `scaling` (amax / 448 per row of the weight, or
        per 128 x 128 block) and its bias cast to `out_dtype` (default: `linear`'s dtype where
        it is bfloat16 or float16, else bfloat16), on `linear`'s device.

        Raises:
            MatmulInputError: as the constructor, for `linear`'s feature counts.
        """
        weight = linear.weight.detach()
        if out_dtype is None:
            out_dtype = weight.dtype if weight.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta", table=table,
                     scaling=scaling, out_dtype=out_dtype)
        q, scale = _WEIGHT_QUANTIZERS[module.scaling](weight)
        module.weight = torch.nn.Parameter(q, requires_grad=False)
        module.weight_scale = scale
        if linear.bias is not None:
            module.bias = torch.nn.Parameter(linear.bias.detach().to(out_dtype), requires_grad=False)
        return module

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.shape[-1] != self.in_features:
            raise MatmulInputError(f"Fp8Linear takes [..., {self.in_features}], not {list(input.shape)}")
        x = input.reshape(-1, self.in_features)
        tokens = x.shape[0]
        if self.scaling is Scaling.BLOCKWISE:
            if tokens % BLOCKWISE_ROWS:
                x = F.pad(x, (0, 0, 0, -tokens % BLOCKWISE_ROWS))
            xq, scale_a = quantize_blockwise_activations(x)
        else:
            xq, scale_a = quantize_rowwise(x)
        w = self.weight.t()
        if xq.is_cuda and torch.compiler.is_compiling():
            y = scaled_mm_op(xq, w, scale_a, self.weight_scale, self.bias, self.table_key, self.out_dtype)
        elif xq.is_cuda:
            y = matmul(xq, w, registered_table(self.table_key), self.out_dtype, bias=self.bias, scale_a=scale_a,
                       scale_b=self.weight_scale)
        else:  # matmul takes CUDA tensors only; torch_gemm is its fallback's math on any device
            y = torch_gemm(xq, w, self.out_dtype, bias=self.bias, scale_a=scale_a, scale_b=self.weight_scale)
        return y[:tokens].reshape(*input.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"scaling={_NAMES[self.scaling]!r}, out_dtype={self.out_dtype}, table={self.table_key!r}")
