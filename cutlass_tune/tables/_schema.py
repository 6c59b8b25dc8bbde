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
| `REGIME_COLUMNS` | per timing regime r, `<r>_regime`, `<r>_ratio`, `<r>_sm_mhz`, `<r>_power_w` (4) |
| call_site_ratio, call_site_regime | the ratio `check` measured through `matmul`, and its regime (5) |

(1) The baseline of a plain GEMM is cuBLAS; that of a fused epilogue or scaled fp8 problem is
torch's eager call of the same math (`F.linear` with its bias, then the activation;
`torch._scaled_mm` with the scales). The torch.compile figures are empty where the run did not
time it (plain GEMMs, tables written before fused epilogues). The epilogue and scaling are part
of the problem: a lookup matches both exactly.
(3) `strongest_ratio` ranks a problem's kernels, and a kernel is a winner only where it is above 1.
`strongest` is one of "cuBLAS" (a plain GEMM), "torch eager", "torch.compile", "cuBLASLt
epilogue" (a fused or scaled one: the fastest of the three in the pass), "torch._grouped_mm" (a
grouped one). Tables written before it read with the ratio's baseline as the strongest.
(4) r is one of sustained, idle_gap, interleaved, as_captured, in_model: the regime measured in
(`RegimeSpec.name`, "" where none), the median ratio in it, the kernel's SM clock and the board's
power there. The bench's regimes' figures come from `confirm --regime` passes of the kernel the
table chose (chosen by its sustained passes, else by the sweep): of the row's run-time variant, else
of another run-time variant of that kernel timed in the regime. The in_model ones are `tune-model`'s
(`in-model:compiled:4096`: the model's step as it ran, its token count): torch's kernel time in the
step over the row's kernel's, where they choose the row's kernel (the candidate fastest in the
model; below 1 where torch's path was faster there, so the dispatcher keeps torch's path). Tables
written before regimes read them as empty; tables written before the in-model regime have
`in_model_ratio` alone (its regime, clock and power read as empty).
(5) Empty where not measured. The dispatcher holds `min_ratio` against the first the row has of:
in_model_ratio, call_site_ratio, the lowest of `ratio` and the bench regimes' ratios
(`runtime.Match.dispatch_ratio`).
(2) `Routing`: uniform, zipf, histogram; m is then the routed rows of all experts together. A
single GEMM has "none", 0 and "none". A grouped lookup matches the experts, N and K exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..errors import CutlassTuneError
from ..regime import Regime
from ..space import KernelConfig, Operation, Problem, RuntimeArgs, columns

REGIME_FIGURES = ("ratio", "sm_mhz", "power_w")
"""A regime's figures in a table, each a column `<regime.column>_<figure>` beside `<regime.column>_regime`."""
REGIME_COLUMNS = tuple(f"{r.column}_{what}" for r in Regime for what in ("regime", *REGIME_FIGURES))
"""Per timing regime: the regime's name, and the kernel's ratio, SM clock and power in it (empty where the
table has none; tables written before regimes lack them all)."""
DISPATCH_COLUMNS = ("call_site_ratio", "call_site_regime")
"""The call-site figures `check` records, which the dispatcher prefers to a confirm's after the
in-model ones (`Match.dispatch_ratio`); tables written before them lack them (read as empty)."""
PROFILER_RANGE = "cutlass_tune.gemm:"
"""The profiler range the runtime's doors open around a GEMM call while a profiler runs: this prefix
and the problem's name (`tune-model` reads `in_model_ratio` from the kernels launched in it). Not
"cutlass_tune:", which the operators' own events ("cutlass_tune::grouped_mm") begin with."""
REGIME_TEXT_COLUMNS = (*(f"{r.column}_regime" for r in Regime), "call_site_regime")
"""The text columns of `REGIME_COLUMNS` and `DISPATCH_COLUMNS` (a regime's name or "")."""
REGIME_NUMBER_COLUMNS = tuple(c for c in (*REGIME_COLUMNS, *DISPATCH_COLUMNS) if c not in REGIME_TEXT_COLUMNS)
KNOB_COLUMNS = columns(KernelConfig)
LATER_KNOBS = columns(KernelConfig, added_later=True)
"""Knob columns that tables written before them lack; reading a table fills them from `config`."""
COLUMNS = ("gpu", "problem", "m", "n", "k", "dtype_a", "dtype_b", "dtype_d", "layout", "kernel",
           "config_hash", "runtime", *columns(RuntimeArgs), "tflops", "median_ms",
           "p20_ms", "p80_ms", "samples", "spread", "cublas_tflops", "ratio", *KNOB_COLUMNS, "config",
           "run_id", "sweep_ratio", "confirm_passes", "ratio_low", "ratio_high", "method", "energy_mj",
           "cublas_energy_mj", "epilogue", "scaling", "torch_compile_tflops", "torch_compile_ratio",
           "grouping", "groups", "routing", "cublaslt_tflops", "cublaslt_ratio", "strongest", "strongest_tflops",
           "strongest_ratio", *REGIME_COLUMNS, *DISPATCH_COLUMNS)
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


def regime_figures(row: Mapping[Any, Any]) -> list[tuple[str, float, float, float]]:
    """A table row's figures per timing regime it was measured in: (the regime's name, ratio, SM
    clock in MHz, power in W; NaN where not reported), in `Regime` order; empty for a row without."""
    out = []
    for r in Regime:
        name = row.get(f"{r.column}_regime")
        if isinstance(name, str) and name:
            out.append((name, *(_number(row.get(f"{r.column}_{what}")) for what in REGIME_FIGURES)))
    return out  # type: ignore[return-value]


def regime_text(row: Mapping[Any, Any]) -> str:
    """`regime_figures` and the call-site ratio in a few words ("" for none): "idle-gap:200us 1.105
    at 1980 MHz 580 W; in-model:compiled:4096 1.120 at 1755 MHz 610 W; call site 0.970 (sustained)";
    an `in_model_ratio` without its regime (a table written before the in-model regime) as "in the
    model 1.120"."""
    parts = [f"{name} {ratio:.3f} at {mhz:.0f} MHz {watts:.0f} W".replace(" at nan MHz", "").replace(" nan W", "")
             for name, ratio, mhz, watts in regime_figures(row)]
    call_site = _number(row.get("call_site_ratio"))
    if math.isfinite(call_site):
        parts.append(f"call site {call_site:.3f} ({row.get('call_site_regime') or 'sustained'})")
    in_model = _number(row.get(f"{Regime.IN_MODEL.column}_ratio"))
    if math.isfinite(in_model) and not row.get(f"{Regime.IN_MODEL.column}_regime"):
        parts.append(f"in the model {in_model:.3f}")
    return "; ".join(parts)


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def with_call_site(frame: pd.DataFrame, figures: Mapping[str, tuple[float, str]]) -> pd.DataFrame:
    """`frame` with each row of a problem in `figures` (problem name -> call-site ratio and the
    regime it was measured in, as `check` measures them) holding them in `call_site_ratio` and
    `call_site_regime`; the other rows as they were (empty where the table had none)."""
    out = frame.copy()
    if "call_site_ratio" not in out.columns:
        out["call_site_ratio"] = math.nan
    if "call_site_regime" not in out.columns:
        out["call_site_regime"] = ""
    out["call_site_ratio"] = out["call_site_ratio"].astype(float)
    out["call_site_regime"] = out["call_site_regime"].astype(object)
    for problem, (ratio, regime) in figures.items():
        at = out["problem"] == problem
        out.loc[at, "call_site_ratio"] = float(ratio)
        out.loc[at, "call_site_regime"] = regime
    return out


def experts_cells(problem: Problem) -> dict[str, int | str]:
    """A problem's `EXPERTS_COLUMNS`: its experts and routing, or 0 and "none" for a single GEMM
    (the tuner writes them beside `Operation.cells`)."""
    if not problem.grouped:
        return {"groups": 0, "routing": NO_ROUTING}
    return {"groups": problem.groups, "routing": problem.routing.value}
