"""Config space: which kernels and problems exist, which are valid, and why not."""

from ._rules import (
    SMEM_CAPACITY_BYTES,
    Rejection,
    SmemUsage,
    check_config,
    check_pair,
    check_problem,
    check_runtime,
    smem_usage,
)
from ._spec import SearchSpace, load_space
from ._types import (
    AUTO_EPILOGUE_TILE,
    AUTO_STAGES,
    Decomposition,
    DType,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Layout,
    Problem,
    RasterOrder,
    RuntimeArgs,
    TileScheduler,
    layout_code,
)

__all__ = [
    "AUTO_EPILOGUE_TILE", "AUTO_STAGES", "DType", "Decomposition", "EpilogueSchedule", "KernelConfig", "KernelSchedule",
    "Layout", "Problem", "RasterOrder", "Rejection", "RuntimeArgs", "SMEM_CAPACITY_BYTES",
    "SearchSpace", "SmemUsage", "TileScheduler", "check_config", "check_pair", "check_problem",
    "check_runtime", "layout_code", "load_space", "smem_usage",
]
