"""Config space: which kernels and problems exist, which are valid, and why not; what CUTLASS
makes of a config (`cutlass_tune.space.cutlass`, its names re-exported here)."""

from ._auto import AutoKernels, Census
from ._epilogue import (
    ACTIVATIONS,
    GLU_BLOCK,
    NODES,
    Activation,
    ActivationFacets,
    Broadcast,
    Epilogue,
    Node,
    NodeFacets,
    NodeKind,
    Operand,
    Pair,
    Role,
    activation_of_aten,
    activation_of_module_class,
)
from ._knobs import KernelConfig, Knob, RuntimeArgs, cells, column_kinds, columns, texts
from ._operation import MAX_GROUPS, Inputs, KindRegistry, Operation, OperationKind, Problem, routed_rows
from ._rules import (
    Rejection,
    check_config,
    check_pair,
    check_problem,
    check_runtime,
    operation_problem,
    problem_dim_problem,
)
from ._spec import SearchSpace, load_space, space_for_shapes, sweep_space
from ._types import (
    AUTO_EPILOGUE_TILE,
    AUTO_STAGES,
    PAIRED_EPILOGUE,
    Decomposition,
    DType,
    EpilogueSchedule,
    Grouping,
    KernelSchedule,
    Layout,
    RasterOrder,
    Routing,
    Scaling,
    TileScheduler,
    layout_code,
)
from .cutlass import (
    BLOCKWISE_K,
    BLOCKWISE_SCALE_N,
    KERNEL_SMEM_ALLOWANCE_BYTES,
    SMEM_CAPACITY_BYTES,
    WGMMA_N_DEFAULT,
    SmemUsage,
    accumulator_registers,
    blockwise_scales_per_tile,
    epilogue_scales,
    epilogue_smem_bytes,
    epilogue_tile,
    fused,
    needs_extended_wgmma,
    smem_usage,
    wgmma_n,
)

__all__ = [
    "ACTIVATIONS", "GLU_BLOCK", "NODES", "ActivationFacets", "Broadcast", "Node", "NodeFacets", "NodeKind", "Operand",
    "Pair", "Role", "activation_of_aten", "activation_of_module_class",
    "AUTO_EPILOGUE_TILE", "AUTO_STAGES", "BLOCKWISE_K", "BLOCKWISE_SCALE_N", "KERNEL_SMEM_ALLOWANCE_BYTES",
    "PAIRED_EPILOGUE", "SMEM_CAPACITY_BYTES", "WGMMA_N_DEFAULT", "Activation", "AutoKernels", "Census", "DType",
    "Decomposition", "Epilogue", "EpilogueSchedule", "Grouping", "Inputs", "KindRegistry", "MAX_GROUPS",
    "KernelConfig", "KernelSchedule", "Knob", "Layout", "Operation", "OperationKind", "Problem", "RasterOrder",
    "Rejection", "Routing", "RuntimeArgs", "Scaling", "SearchSpace", "SmemUsage", "TileScheduler",
    "accumulator_registers", "blockwise_scales_per_tile", "cells", "check_config", "check_pair", "check_problem",
    "check_runtime", "column_kinds", "columns", "epilogue_scales", "epilogue_smem_bytes", "epilogue_tile", "fused",
    "layout_code", "load_space", "needs_extended_wgmma", "operation_problem", "problem_dim_problem", "routed_rows",
    "smem_usage", "space_for_shapes", "sweep_space", "texts", "wgmma_n",
]
