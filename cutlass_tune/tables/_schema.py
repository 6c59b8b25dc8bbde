"""The columns of a best-config table: the best verified kernel per (GPU, problem).

| column | meaning |
|---|---|
| gpu | GPU model the figures were measured on |
| problem, m, n, k, dtype_a, dtype_b, dtype_d, layout | the GEMM (layout: BLAS two letters, e.g. tn) |
| epilogue, scaling | the fused epilogue (`Epilogue.name`: none, bias+silu, ...), the fp8 scaling (none, rowcol...) |
| grouping, groups, routing | a grouped GEMM (MoE experts): "grouped", its experts E, how its routed rows fall (2) |
| kernel, config_hash | name and content hash of the winning `KernelConfig` |
| runtime, raster, swizzle, splits, decomposition | its best run-time variant |
| tflops, median_ms, p20_ms, p80_ms, samples | its timing (median, by the store's timing method) |
| spread | (p80 - p20) / median |
| cublas_tflops, ratio | the baseline in the same run (paired where the store pairs), tflops / cublas_tflops (1) |
| torch_compile_tflops, torch_compile_ratio | `torch.compile` of the same math in the same run, and tflops over it (1) |
| cublaslt_tflops, cublaslt_ratio | cuBLASLt's own epilogue of the same math in the same run, tflops over it (1) |
| strongest, strongest_tflops, strongest_ratio | the fastest torch path of the same math, tflops over it (3) |
| `KNOB_COLUMNS` | the config's knobs, one column each, as declared in space/_knobs.py (0: auto) |
| config | the config as JSON (`KernelConfig.from_dict(json.loads(...))` rebuilds it) |
| run_id | the run that measured it |
| sweep_ratio | the best ratio the sweep measured for this kernel and variant |
| confirm_passes | passes of `cutlass-tune confirm` that measured it (0: not confirmed) |
| ratio_low, ratio_high | lowest and highest confirmed ratio (both `ratio` when not confirmed) |

(1) The baseline of a plain GEMM is cuBLAS; that of a fused epilogue or scaled fp8 problem is
torch's eager call of the same math (`F.linear` with its bias, then the activation;
`torch._scaled_mm` with the scales). The torch.compile figures are empty where the run did not
time it (plain GEMMs, tables written before fused epilogues). The epilogue and scaling are part
of the problem: a lookup matches both exactly.
(3) `strongest_ratio` ranks a problem's kernels, and a kernel is a winner only where it is above 1.
`strongest` is one of "cuBLAS" (a plain GEMM), "torch eager", "torch.compile", "cuBLASLt
epilogue" (a fused or scaled one: the fastest of the three in the pass), "torch._grouped_mm" (a
grouped one). Tables written before it read with the ratio's baseline as the strongest.
(2) `Routing`: uniform, zipf, histogram; m is then the routed rows of all experts together. A
single GEMM has "none", 0 and "none". A grouped lookup matches the experts, N and K exactly.
"""

from __future__ import annotations

from ..errors import CutlassTuneError
from ..space import KernelConfig, Operation, Problem, RuntimeArgs, columns

KNOB_COLUMNS = columns(KernelConfig)
LATER_KNOBS = columns(KernelConfig, added_later=True)
"""Knob columns that tables written before them lack; reading a table fills them from `config`."""
COLUMNS = ("gpu", "problem", "m", "n", "k", "dtype_a", "dtype_b", "dtype_d", "layout", "kernel",
           "config_hash", "runtime", *columns(RuntimeArgs), "tflops", "median_ms",
           "p20_ms", "p80_ms", "samples", "spread", "cublas_tflops", "ratio", *KNOB_COLUMNS, "config",
           "run_id", "sweep_ratio", "confirm_passes", "ratio_low", "ratio_high", "method", "energy_mj",
           "cublas_energy_mj", "epilogue", "scaling", "torch_compile_tflops", "torch_compile_ratio",
           "grouping", "groups", "routing", "cublaslt_tflops", "cublaslt_ratio", "strongest", "strongest_tflops",
           "strongest_ratio")
LATER_COLUMNS = ("method", "energy_mj", "cublas_energy_mj")
"""Columns that tables written before them lack: the timing method behind `ratio` (empty:
not recorded) and the energy per GEMM of the kernel and of cuBLAS (sustained timing)."""
OPERATION_COLUMNS = Operation.ADDED_LATER
"""Columns of the operation that tables written before fused epilogues lack: such a table's rows
are plain GEMMs (reading fills in "none")."""
EXPERTS_COLUMNS = ("groups", "routing")
"""A grouped problem's experts and routing, which tables written before grouped GEMMs lack
(read as a single GEMM's: 0 and "none")."""
NO_ROUTING = "none"
"""The routing cell of a single GEMM."""
COMPILE_COLUMNS = ("torch_compile_tflops", "torch_compile_ratio")
"""The torch.compile baseline's figures, which tables written before it lack (read as empty)."""
CUBLASLT_COLUMNS = ("cublaslt_tflops", "cublaslt_ratio")
"""cuBLASLt's epilogue's figures, which tables written before it lack (read as empty)."""
STRONGEST_COLUMNS = ("strongest", "strongest_tflops", "strongest_ratio")
"""The strongest torch path and the figures against it, which tables written before it lack (read
as the ratio's own baseline: `cublas_tflops`, `ratio`)."""


class BestTableError(CutlassTuneError):
    """A best-config table cannot be built or read, or has no entry for a lookup."""


def experts_cells(problem: Problem) -> dict[str, int | str]:
    """A problem's `EXPERTS_COLUMNS`: its experts and routing, or 0 and "none" for a single GEMM
    (the tuner writes them beside `Operation.cells`)."""
    if not problem.grouped:
        return {"groups": 0, "routing": NO_ROUTING}
    return {"groups": problem.groups, "routing": problem.routing.value}
