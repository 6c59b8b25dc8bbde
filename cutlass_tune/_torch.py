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
