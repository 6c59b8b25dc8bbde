"""Runtime: what a serving host imports to run tuned kernels, without the tuner.

`BestTable` looks problems up in a best-config table (a bundle from `cutlass-tune export`, a
table file, or a store through the tuner); `matmul` and `Gemm` run the tuned kernels on torch
tensors, fused epilogues (bias, activation, residual) and fp8 scales included; `mm` and `linear`
are the operators `torch.ops.cutlass_tune.mm`, `.linear` and `.grouped_mm` (a table bound
to a key by `register_table`), for models and torch.compile (`.grouped_mm`'s backward runs
`.grouped_weight_grad`, as `grouped_weight_grad` the tuned weight gradients); `Linear` and
`patch` put them into models,
`Fp8Linear` an fp8 e4m3 weight with row-wise or block-wise scales; `moe_experts` and
`MoEExperts` a MoE experts layer (routing, gather, both grouped GEMMs, combine);
`LoadedKernel` and the ABI's names come from `cutlass_tune.kernel`. Every one of them dispatches
through `resolve(table, call) -> Plan` (`_dispatch`: the plan of a call signature, kept per table
in a `PlanCache`). Importing this package, and
loading a bundle, imports none of the compiler, the store, the search, the dashboard or their
dependencies (SQLAlchemy, Optuna, plotly); a kernel no bundle holds is compiled on first use.
"""

from typing import TYPE_CHECKING, Any

from ..kernel import (
    GemmArgs,
    GemmInstance,
    KernelLoadError,
    KernelStatusError,
    LoadedKernel,
    cutlass_status_name,
    make_args,
)

if TYPE_CHECKING:  # what `__getattr__` gives, for the type checker
    from ..tables import BestTableError, BundledKernel, BundleError
    from ._dispatch import (
        Call,
        Fallback,
        FallbackReason,
        KernelRef,
        Kind,
        Plan,
        Ready,
        Workspace,
        eager_direct_allowed,
        resolve,
    )
    from ._fp8_linear import Fp8Linear
    from ._grouped import GroupedGemm, grouped_mm, grouped_problem_of, torch_grouped_mm
    from ._grouped_op import grouped_mm_op, grouped_weight_grad_op
    from ._inductor import FusionDecision, FusionPass, inductor_options
    from ._linear import Linear
    from ._matmul import Gemm, MatmulInputError, activation_of, matmul, operation_of, problem_of, torch_gemm
    from ._moe import (
        ExpertActivation,
        GateForm,
        MoEDecode,
        MoEExperts,
        MoEInputError,
        MoERouting,
        moe_combine,
        moe_experts,
        moe_gather,
        moe_routing,
    )
    from ._moe_glu import interleave_gate_up, split_gate_up
    from ._op import UnregisteredTableError, linear, mm, register_table
    from ._patch import LayerDecision, PatchReport, patch
    from ._table import BestTable, Match, PlanCache
    from ._weight_grad import grouped_weight_grad

__all__ = ["BestTable", "BestTableError", "BundleError", "BundledKernel", "Call", "ExpertActivation", "Fallback",
           "FarRowWarning",
           "FallbackReason", "Fp8Linear", "FusionDecision", "FusionPass", "GateForm", "Gemm", "GemmArgs",
           "GemmInstance", "GroupedGemm", "MoEDecode", "MoEExperts", "MoEInputError", "MoERouting", "moe_combine",
           "moe_experts", "moe_gather", "moe_routing",
           "KernelLoadError", "KernelRef", "KernelStatusError", "Kind", "LayerDecision", "Linear", "LoadedKernel",
           "Match", "MatmulInputError", "PatchReport", "Plan", "PlanCache", "Ready", "UnregisteredTableError",
           "Workspace", "activation_of", "cutlass_status_name", "eager_direct_allowed", "grouped_mm", "grouped_mm_op",
           "grouped_problem_of", "grouped_weight_grad", "grouped_weight_grad_op", "inductor_options",
           "interleave_gate_up", "linear", "make_args", "matmul", "mm", "operation_of", "patch", "problem_of",
           "register_table", "resolve", "split_gate_up", "torch_gemm", "torch_grouped_mm"]

_TABLES = ("BestTableError", "BundleError", "BundledKernel")
_LOOKUP = ("BestTable", "Match", "PlanCache")
_DISPATCH = ("Call", "Fallback", "FallbackReason", "FarRowWarning", "KernelRef", "Kind", "Plan", "Ready", "Workspace",
             "eager_direct_allowed", "resolve")
_MATMUL = ("Gemm", "MatmulInputError", "activation_of", "matmul", "operation_of", "problem_of", "torch_gemm")
_MODELS = {"mm": "_op", "linear": "_op", "register_table": "_op", "UnregisteredTableError": "_op", "Linear": "_linear",
           "Fp8Linear": "_fp8_linear",
           "patch": "_patch", "PatchReport": "_patch", "LayerDecision": "_patch", "GroupedGemm": "_grouped",
           "grouped_mm": "_grouped", "grouped_problem_of": "_grouped", "torch_grouped_mm": "_grouped",
           "grouped_mm_op": "_grouped_op", "grouped_weight_grad_op": "_grouped_op",
           "grouped_weight_grad": "_weight_grad", "inductor_options": "_inductor", "FusionPass": "_inductor",
           "FusionDecision": "_inductor", **{name: "_moe" for name in (
               "ExpertActivation", "GateForm", "MoEDecode", "MoEExperts", "MoEInputError", "MoERouting", "moe_combine",
               "moe_experts", "moe_gather", "moe_routing")},
           "interleave_gate_up": "_moe_glu", "split_gate_up": "_moe_glu"}


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
    # Imported on first use: a host pays for pandas (the tables) and torch only when it uses them.
    if name in _TABLES:
        from .. import tables

        return getattr(tables, name)
    if name in _LOOKUP:
        from . import _table

        return getattr(_table, name)
    if name in _DISPATCH:
        from . import _dispatch

        return getattr(_dispatch, name)
    if name in _MATMUL:
        from . import _matmul

        return getattr(_matmul, name)
    if name in _MODELS:
        import importlib

        # Any of them registers all of torch.ops.cutlass_tune (.mm, .linear and .grouped_mm).
        for module in ("_op", "_grouped_op"):
            importlib.import_module(f".{module}", __name__)
        return getattr(importlib.import_module(f".{_MODELS[name]}", __name__), name)
    raise AttributeError(f"module 'cutlass_tune.runtime' has no attribute {name!r}")
