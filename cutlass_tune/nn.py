"""Modules that run the tuned GEMM inside models (docs/models.md).

`Linear` is torch.nn.Linear on `torch.ops.cutlass_tune.mm`, or with `activation=` (an
`Activation`: relu, gelu, ...) nn.Linear and its activation in one fused kernel (`torch.ops.cutlass_tune.linear`);
`cutlass_tune.patch(model, table)` swaps a model's covered nn.Linear layers for it.
"""

from .runtime import Linear

__all__ = ["Linear"]
