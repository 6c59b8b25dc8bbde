"""cutlass-tune: autotune CUTLASS 3.x GEMM kernels on NVIDIA Hopper (SM90).

The user-facing API: `load_best` (best-config tables as pandas DataFrames), `BestTable`
(lookups), `matmul` and `Gemm` (run tuned kernels on torch tensors), `grouped_mm` (MoE experts'
grouped GEMM, torch._grouped_mm's operands), `grouped_weight_grad` (its weight gradient),
`moe_experts` (a MoE experts layer: routing, gather, both tuned grouped GEMMs, combine); for models, `patch` (swap a
model's covered nn.Linear layers for `cutlass_tune.nn.Linear`), `inductor_options` (torch.compile options
that fuse GEMMs with what follows them) and `register_table` (a table's
key for the operator `torch.ops.cutlass_tune.mm`). Stages live in
`cutlass_tune.space`, `.render`, `.compile`, `.bench`, `.search`, `.store` and `.report`; what a
serving host needs in `.tables` and `.runtime`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what `__getattr__` gives, for the type checker
    from . import nn as nn
    from .report import load_best as load_best
    from .runtime import BestTable as BestTable
    from .runtime import Gemm as Gemm
    from .runtime import grouped_mm as grouped_mm
    from .runtime import grouped_weight_grad as grouped_weight_grad
    from .runtime import inductor_options as inductor_options
    from .runtime import matmul as matmul
    from .runtime import moe_experts as moe_experts
    from .runtime import patch as patch
    from .runtime import register_table as register_table

__version__ = "0.1.0"

_RUNTIME = ("BestTable", "Gemm", "grouped_mm", "grouped_weight_grad", "inductor_options", "matmul", "moe_experts",
            "patch", "register_table")
_REPORT = ("load_best",)
__all__ = [*_RUNTIME, *_REPORT, "__version__", "nn"]


def __dir__() -> list[str]:
    # `__getattr__` serves the public names lazily; dir() and tab completion list them still.
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    # Kept in the module once served: a module's `__getattr__` runs on every access of a name it
    # serves (2.5-7 us for `cutlass_tune.matmul` and `.grouped_mm`, more than their own host time).
    value = _lazy(name)
    globals()[name] = value
    return value


def _lazy(name: str) -> Any:
    # Imported on first use: `import cutlass_tune` stays light (no torch, pandas) for the CLI.
    if name in _RUNTIME:
        from . import runtime

        return getattr(runtime, name)
    if name in _REPORT:
        from . import report

        return getattr(report, name)
    if name == "nn":  # a submodule: `from . import nn` would ask this function for it again
        import cutlass_tune.nn

        return cutlass_tune.nn
    raise AttributeError(f"module 'cutlass_tune' has no attribute {name!r}")
