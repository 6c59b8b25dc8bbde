"""Config space: which kernels and problems exist, which are valid, and why not."""

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
from ._operation import MAX_GROUPS, Operation, Problem, routed_rows
from ._rules import (
    SMEM_CAPACITY_BYTES,
    Rejection,
    SmemUsage,
    check_config,
    check_pair,
    check_problem,
    check_runtime,
    problem_dim_problem,
    smem_usage,
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

__all__ = [
    "ACTIVATIONS", "GLU_BLOCK", "NODES", "ActivationFacets", "Broadcast", "Node", "NodeFacets", "NodeKind", "Operand",
    "Pair", "Role", "activation_of_aten", "activation_of_module_class",
    "AUTO_EPILOGUE_TILE", "AUTO_STAGES", "PAIRED_EPILOGUE", "SMEM_CAPACITY_BYTES", "Activation", "AutoKernels",
    "Census", "DType", "Decomposition", "Epilogue", "EpilogueSchedule", "Grouping", "MAX_GROUPS", "KernelConfig",
    "KernelSchedule", "Knob", "Layout", "Operation", "Problem", "RasterOrder", "Rejection", "Routing", "RuntimeArgs",
    "Scaling", "SearchSpace", "SmemUsage", "TileScheduler", "cells", "check_config", "check_pair", "check_problem",
    "check_runtime", "column_kinds", "columns", "layout_code", "load_space", "problem_dim_problem", "routed_rows",
    "smem_usage", "space_for_shapes", "sweep_space", "texts",
]
