"""`Linear`: torch.nn.Linear whose GEMM is the tuned operator (`cutlass_tune.nn.Linear`),
optionally followed by its activation, fused into the kernel."""

from __future__ import annotations

from pathlib import Path

import torch

from .._torch import ACTIVATION
from ..space import Activation
from ._dispatch import eager_direct_allowed
from ._matmul import activation_of
from ._op import linear_direct, mm_direct, table_key
from ._table import BestTable

_MM = torch.ops.cutlass_tune.mm.default  # registered by importing ._op
_LINEAR = torch.ops.cutlass_tune.linear.default


class Linear(torch.nn.Linear):
    """nn.Linear computing x @ weight^T by `torch.ops.cutlass_tune.mm`, then adding the bias.

    Same parameters, initialization and state_dict keys as torch.nn.Linear (it is one), so its
    weights load from a checkpoint of the model it replaced. The tuned kernels run on CUDA, for
    bfloat16 and float16 weights and inputs of the weight's dtype (no autocast: cast the model);
    elsewhere, and for shapes the table has no kernel for, torch's own GEMM runs.

    Without an activation the forward is one operator call (`torch.ops.cutlass_tune.mm`) and
    one add, so torch.compile fuses the bias add into what follows. With one (`activation`: an
    `Activation`) it computes activation(x @ weight^T + bias): where no gradient
    is needed (under torch.no_grad or inference_mode, or of frozen parameters and input) by one
    call of `torch.ops.cutlass_tune.linear`, which runs the table's fused kernel of that
    epilogue (torch's F.linear and activation where the table has none); where one is, by `mm`,
    the bias add and torch's activation, whose backward keeps the pre-activation instead of
    recomputing it (the fused operator's backward would run one more GEMM).

    Args:
        in_features, out_features, bias, device, dtype: as torch.nn.Linear.
        table: the best-config table (a `BestTable`, a path `BestTable.load` reads, or a key from
            `register_table`). Only its key is kept (`table_key`): it is process-local, so a
            pickled module needs its table registered under that key where it is loaded.
        activation: an `Activation` or its name (none, relu, gelu: the erf form, ...).

    Raises:
        UnregisteredTableError: `table` is a string that is neither a registered key nor a
            readable table.
        MatmulInputError: an activation that is none of these.
    """

    activation: Activation = Activation.NONE
    """The activation that follows (a class default for modules pickled before it existed)."""
    fused_bias: bool = False
    """Whether the bias is added in the kernel's epilogue (the table's `bias` entries, one call of
    `torch.ops.cutlass_tune.linear`) rather than after the GEMM by torch (`from_linear`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, *, table: BestTable | str | Path,
                 activation: Activation | str = Activation.NONE):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation_of(activation)
        self.table_key = table_key(table)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, table: BestTable | str | Path, *,
                    activation: Activation | str = Activation.NONE, fuse_bias: bool = False) -> Linear:
        """A Linear sharing `linear`'s parameters (the same Parameter objects: an optimizer
        holding them keeps working, nothing is copied) and its training mode, followed by
        `activation` (the activation module that followed `linear` in its model, fused).
        `fuse_bias`: without an activation, add the bias in the kernel's epilogue (the table's
        `bias` entries, as F.linear adds it in cuBLASLt's), forward and backward."""
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta",
                     dtype=linear.weight.dtype, table=table, activation=activation)
        module.fused_bias = fuse_bias and linear.bias is not None
        module.weight = linear.weight
        if linear.bias is not None:
            module.bias = linear.bias
        return module.train(linear.training)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        no_grad = not (torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad
                                                    or (self.bias is not None and self.bias.requires_grad)))
        # Eager code that needs no gradient calls the operators' CUDA kernels directly: a small
        # GEMM's kernel is shorter than the dispatcher's host path (benchmarks/linear_host.py).
        direct = no_grad and eager_direct_allowed(input, self.weight, self.bias)
        if (self.activation is not Activation.NONE and no_grad) or (
                self.fused_bias and self.bias is not None and self.activation is Activation.NONE):
            call = linear_direct if direct else _LINEAR
            return call(input, self.weight, self.bias, self.activation.value, self.table_key)
        out = (mm_direct if direct else _MM)(input, self.weight.t(), self.table_key)
        out = out if self.bias is None else out + self.bias
        return out if self.activation is Activation.NONE else ACTIVATION[self.activation](out)

    def extra_repr(self) -> str:
        shown = "" if self.activation is Activation.NONE else f", activation={self.activation.value!r}"
        shown += ", fused_bias=True" if self.fused_bias else ""
        return f"{super().extra_repr()}{shown}, table={self.table_key!r}"

