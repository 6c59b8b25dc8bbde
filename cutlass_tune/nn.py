"""Modules that run the tuned GEMM inside models (docs/models.md).

`Linear` is torch.nn.Linear on `torch.ops.cutlass_tune.mm`; `cutlass_tune.patch(model, table)`
swaps a model's covered nn.Linear layers for it.
"""

from .runtime import Linear

__all__ = ["Linear"]
