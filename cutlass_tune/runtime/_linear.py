"""`Linear`: torch.nn.Linear whose GEMM is the tuned operator (`cutlass_tune.nn.Linear`)."""

from __future__ import annotations

from pathlib import Path

import torch

from ._op import table_key
from ._table import BestTable

_MM = torch.ops.cutlass_tune.mm.default  # registered by importing ._op


class Linear(torch.nn.Linear):
    """nn.Linear computing x @ weight^T by `torch.ops.cutlass_tune.mm`, then adding the bias.

    Same parameters, initialization and state_dict keys as torch.nn.Linear (it is one), so its
    weights load from a checkpoint of the model it replaced. The tuned kernels run on CUDA, for
    bfloat16 and float16 weights and inputs of the weight's dtype (no autocast: cast the model);
    elsewhere, and for shapes the table has no kernel for, torch's own GEMM runs.

    The forward is one operator call and one add, so torch.compile fuses the bias add into what
    follows; a later epilogue will fuse it into the kernel.

    Args:
        in_features, out_features, bias, device, dtype: as torch.nn.Linear.
        table: the best-config table (a `BestTable`, a path `BestTable.load` reads, or a key from
            `register_table`). Only its key is kept (`table_key`): it is process-local, so a
            pickled module needs its table registered under that key where it is loaded.

    Raises:
        UnregisteredTableError: `table` is a string that is neither a registered key nor a
            readable table.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, *, table: BestTable | str | Path):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.table_key = table_key(table)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, table: BestTable | str | Path) -> Linear:
        """A Linear sharing `linear`'s parameters (the same Parameter objects: an optimizer
        holding them keeps working, nothing is copied) and its training mode."""
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta",
                     dtype=linear.weight.dtype, table=table)
        module.weight = linear.weight
        if linear.bias is not None:
            module.bias = linear.bias
        return module.train(linear.training)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = _MM(input, self.weight.t(), self.table_key)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, table={self.table_key!r}"

