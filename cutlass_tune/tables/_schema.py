"""The columns of a best-config table: the best verified kernel per (GPU, problem).

| column | meaning |
|---|---|
| gpu | GPU model the figures were measured on |
| problem, m, n, k, dtype_a, dtype_b, dtype_d, layout | the GEMM (layout: BLAS two letters, e.g. tn) |
| kernel, config_hash | name and content hash of the winning `KernelConfig` |
| runtime, raster, swizzle, splits, decomposition | its best run-time variant |
| tflops, median_ms, p20_ms, p80_ms, samples | its timing (median, by the store's timing method) |
| spread | (p80 - p20) / median |
| cublas_tflops, ratio | cuBLAS in the same run (paired where the store pairs), tflops / cublas_tflops |
| `KNOB_COLUMNS` | the config's knobs, one column each, as declared in space/_knobs.py (0: auto) |
| config | the config as JSON (`KernelConfig.from_dict(json.loads(...))` rebuilds it) |
| run_id | the run that measured it |
| sweep_ratio | the best ratio the sweep measured for this kernel and variant |
| confirm_passes | passes of `cutlass-tune confirm` that measured it (0: not confirmed) |
| ratio_low, ratio_high | lowest and highest confirmed ratio (both `ratio` when not confirmed) |
"""

from __future__ import annotations

from ..errors import CutlassTuneError
from ..space import KernelConfig, RuntimeArgs, columns

KNOB_COLUMNS = columns(KernelConfig)
LATER_KNOBS = columns(KernelConfig, added_later=True)
"""Knob columns that tables written before them lack; reading a table fills them from `config`."""
COLUMNS = ("gpu", "problem", "m", "n", "k", "dtype_a", "dtype_b", "dtype_d", "layout", "kernel",
           "config_hash", "runtime", *columns(RuntimeArgs), "tflops", "median_ms",
           "p20_ms", "p80_ms", "samples", "spread", "cublas_tflops", "ratio", *KNOB_COLUMNS, "config",
           "run_id", "sweep_ratio", "confirm_passes", "ratio_low", "ratio_high", "method", "energy_mj",
           "cublas_energy_mj")
LATER_COLUMNS = ("method", "energy_mj", "cublas_energy_mj")
"""Columns that tables written before them lack: the timing method behind `ratio` (empty:
not recorded) and the energy per GEMM of the kernel and of cuBLAS (sustained timing)."""


class BestTableError(CutlassTuneError):
    """A best-config table cannot be built or read, or has no entry for a lookup."""
