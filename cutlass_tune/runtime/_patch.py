"""`patch`: swap the nn.Linear layers of a model that a best-config table covers.

A layer is covered when the table has at least one entry for its GEMM: its weight's dtype
(bfloat16 or float16) as input and output type, layout tn (x row-major, the N x K weight
row-major: nn.Linear's), and N = out_features, K = in_features. M (the tokens of a batch)
varies from call to call, so it plays no part: `matmul` runs the entry of the nearest tuned M.
A covered layer is swapped where one of its entries beats cuBLAS by the table's own figure
(`min_ratio`), so a patch never trades torch's GEMM for one the table measured slower.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch

from .._torch import TORCH_DTYPE
from ..space import DType, Epilogue, Problem, check_problem
from ._linear import Linear
from ._matmul import device_table
from ._op import registered_table, table_key
from ._table import BestTable

_DTYPES = {TORCH_DTYPE[d]: d for d in (DType.BF16, DType.F16)}
_LISTED = 6
"""Tuned shapes a report names at most, where a layer finds none of its own."""


@dataclasses.dataclass(frozen=True)
class LayerDecision:
    """What `patch` did with one nn.Linear, and why."""

    name: str
    """The layer's qualified name in the model ("" for the model itself)."""
    in_features: int
    out_features: int
    dtype: torch.dtype
    device: torch.device
    swapped: bool
    reason: str
    """For a swapped layer, the entries that cover it; for one left, what it lacks."""


@dataclasses.dataclass(frozen=True)
class PatchReport:
    """The decisions of one `patch` call, one per nn.Linear in the model's `named_modules`
    order (a module reached by two names is listed under both)."""

    table: str
    """The registry key the swapped layers call the operator with."""
    layers: tuple[LayerDecision, ...]

    @property
    def swapped(self) -> tuple[LayerDecision, ...]:
        return tuple(d for d in self.layers if d.swapped)

    @property
    def left(self) -> tuple[LayerDecision, ...]:
        return tuple(d for d in self.layers if not d.swapped)

    def __str__(self) -> str:
        head = (f"cutlass_tune.patch (table {self.table!r}): {len(self.swapped)} of {len(self.layers)} "
                "Linear layers swapped")
        names = [d.name or "(model)" for d in self.layers]
        shapes = [f"{d.in_features}->{d.out_features} {str(d.dtype).removeprefix('torch.')}" for d in self.layers]
        wide = max(map(len, names), default=0), max(map(len, shapes), default=0)
        lines = [f"  {'swapped' if d.swapped else 'left   '}  {name:<{wide[0]}}  {shape:<{wide[1]}}  {d.reason}"
                 for d, name, shape in zip(self.layers, names, shapes)]
        return "\n".join([head, *lines])


class _Coverage:
    """The tn entries of one epilogue in a table whose input and output types match, by
    (dtype, N, K): plain ones (epilogue none, as nn.Linear's GEMM) by default, or those of a fused
    epilogue (`epilogue`) for a Linear fused with what follows it. Scaled fp8 entries compute
    another function and are never counted.

    `ratios`: the columns whose smallest finite value is an entry's ratio (the table's `ratio`;
    a compiled model's pass adds `torch_compile_ratio`, the bar a compiled model has to beat)."""

    def __init__(self, frame: pd.DataFrame, epilogue: Epilogue = Epilogue(), ratios: tuple[str, ...] = ("ratio",)):
        self.epilogue = epilogue
        self.tuned: dict[tuple[str, int, int], list[tuple[int, float]]] = defaultdict(list)
        if frame.empty:
            return
        rows = frame[(frame["layout"] == "tn") & (frame["dtype_a"] == frame["dtype_d"])
                     & (frame["epilogue"] == epilogue.name) & (frame["scaling"] == "none")]
        columns = [rows[c] if c in rows.columns else pd.Series(math.nan, index=rows.index) for c in ratios]
        ratio = pd.concat(columns, axis=1).astype(float).min(axis=1, skipna=True)
        for dtype, n, k, m, r in zip(rows["dtype_a"], rows["n"], rows["k"], rows["m"], ratio):
            self.tuned[(str(dtype), int(n), int(k))].append((int(m), float(r)))

    def _named(self, dtype: DType) -> str:
        """"bf16 tn", or "bf16 tn bias+gelu" for a fused epilogue."""
        return f"{dtype.value} tn" + ("" if self.epilogue.is_plain else f" {self.epilogue.name}")

    def why_not(self, dtype: DType, n: int, k: int, min_ratio: float) -> str | None:
        """None where the table covers N x K of `dtype` with an entry at `min_ratio` of its
        baseline or faster, else what it has instead."""
        named = self._named(dtype)
        baseline = "cuBLAS" if self.epilogue.is_plain else "torch"
        entries = self.tuned.get((dtype.value, n, k))
        if entries:
            best = max((r for _, r in entries if math.isfinite(r)), default=math.nan)
            if min_ratio <= 0 or best >= min_ratio:
                return None
            if math.isnan(best):
                return f"{named} N={n}, K={k}: the table has no ratio to {baseline} to hold to min_ratio {min_ratio}"
            kept = "torch's GEMM is kept" if self.epilogue.is_plain else "torch's path is kept"
            return (f"{named} N={n}, K={k}: tuned at {best:.3f}x {baseline} at best, below min_ratio "
                    f"{min_ratio} ({kept})")
        shapes = sorted({(sn, sk) for d, sn, sk in self.tuned if d == dtype.value})
        if not shapes:
            has = sorted({d for d, _, _ in self.tuned})
            if not has:
                return f"the table has no {named.partition(' ')[2]} entries"
            return f"the table has no {named} entries (it has {named.partition(' ')[2]} entries for: {', '.join(has)})"
        listed = ", ".join(f"{sn}x{sk}" for sn, sk in shapes[:_LISTED])
        more = f" and {len(shapes) - _LISTED} more" if len(shapes) > _LISTED else ""
        return f"no {named} entry for N={n}, K={k} (N x K tuned: {listed}{more})"

    def covering(self, dtype: DType, n: int, k: int) -> str:
        """The entries of N x K of `dtype`, in words."""
        entries = sorted(self.tuned[(dtype.value, n, k)])
        text = f"{self._named(dtype)} N={n}, K={k} tuned at M = {', '.join(str(m) for m, _ in entries)}"
        ratios = [r for _, r in entries if math.isfinite(r)]
        baseline = "cuBLAS" if self.epilogue.is_plain else "torch"
        if ratios:
            low, high = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
            text += f" ({low}x {baseline})" if low == high else f" ({low}-{high}x {baseline})"
        return text


def _why_left(name: str, linear: torch.nn.Linear, coverage: _Coverage, cuda_only: bool,
              min_ratio: float) -> str | None:
    """Why `linear` stays as it is; None when it is swapped."""
    if isinstance(linear, Linear):
        return f"already a cutlass_tune.nn.Linear (table {linear.table_key!r})"
    if type(linear) is not torch.nn.Linear:
        return f"a subclass of nn.Linear ({type(linear).__name__}): its own forward is kept"
    if not name:
        return "the model itself: patch a module that holds it, or use cutlass_tune.nn.Linear.from_linear"
    weight = linear.weight
    if cuda_only and weight.device.type != "cuda":
        return f"on {weight.device}: the tuned kernels run on CUDA (move the model there first)"
    dtype = _DTYPES.get(weight.dtype)
    if dtype is None:
        return f"{weight.dtype}: the tuned kernels take bfloat16 or float16 (cast the model first)"
    n, k = linear.out_features, linear.in_features
    refused = check_problem(Problem(1, n, k, dtype_a=dtype, dtype_b=dtype, dtype_d=dtype))
    if refused:
        return refused[0].reason
    return coverage.why_not(dtype, n, k, min_ratio)


def patch(model: torch.nn.Module, table: BestTable | str | Path, *, cuda_only: bool = True,
          min_ratio: float = 1.0) -> PatchReport:
    """Swap, in place, every torch.nn.Linear of `model` that `table` covers for a
    `cutlass_tune.nn.Linear` sharing its parameters (nothing is copied; state_dict keys stay).

    Covered (module docstring): the table has an entry of the layer's dtype, layout tn, and its
    N (out_features) and K (in_features), at any M. Left as they are, each with its reason:
    layers not on CUDA (with `cuda_only`), of another dtype than bfloat16 and float16, with
    N or K not a multiple of 8 (TMA alignment), without an entry, whose entries are slower than
    `min_ratio` of cuBLAS, subclasses of nn.Linear (their
    forward may matter: MultiheadAttention reads its out_proj's weight directly), the model
    itself, and layers swapped before. Patch the model as it will run: on its device, in its
    dtype. A module reached by two names is swapped for one module at both.

    Args:
        model: the model, changed in place.
        table: a `BestTable`, a path `BestTable.load` reads, or a key from `register_table`.
        cuda_only: leave layers that are not on CUDA. False swaps them too (they run torch's
            GEMM until the model moves to a GPU): for models built on the CPU and moved later.
        min_ratio: leave a layer whose entries all measured slower than this fraction of
            cuBLAS's speed (the table's `ratio`, cuBLAS time / kernel time, by the store's
            ranking method): at the default 1.0 a layer is swapped only where the table shows its
            tuned kernel beating cuBLAS, so patching does not make a model slower by the table's
            own figures. 0 swaps every covered layer.

    Returns:
        A `PatchReport`: each layer, swapped or left, and why.

    Raises:
        BestTableError, BundleError, StoreError: a table path that cannot be read.
    """
    key = table_key(table)
    tuned = registered_table(key)
    coverages: dict[int, _Coverage] = {}

    def coverage_of(linear: torch.nn.Linear) -> _Coverage:
        """The table's entries the layer's device may use: on CUDA, those of its GPU model."""
        device = linear.weight.get_device()
        if device not in coverages:
            rows = tuned if device < 0 else device_table(tuned, device, "patch")
            coverages[device] = _Coverage(rows.frame)
        return coverages[device]

    decisions: list[LayerDecision] = []
    swaps: dict[int, Linear] = {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not isinstance(module, torch.nn.Linear):
            continue
        if id(module) not in swaps:
            why = _why_left(name, module, coverage_of(module), cuda_only, min_ratio)
            if why is not None:
                decisions.append(_decision(name, module, False, why))
                continue
            swaps[id(module)] = Linear.from_linear(module, key)
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, swaps[id(module)])
        covering = coverage_of(module).covering(_DTYPES[module.weight.dtype], module.out_features, module.in_features)
        decisions.append(_decision(name, module, True, covering))
    return PatchReport(key, tuple(decisions))


def _decision(name: str, linear: torch.nn.Linear, swapped: bool, reason: str) -> LayerDecision:
    return LayerDecision(name, linear.in_features, linear.out_features, linear.weight.dtype, linear.weight.device,
                         swapped, reason)
