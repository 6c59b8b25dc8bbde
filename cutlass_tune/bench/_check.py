"""What the caller gets: every entry of a best table called through the public `matmul`.

A table claims, per problem, the ratio its kernel reached against cuBLAS in the sweep (one
launch at a time, by the store's timing method). `check_table` loads the table as a user does
and times `cutlass_tune.matmul` against torch's own call for the same semantics on the same
operands, both in the steady stream a model gives them (`time_sustained`: rotating operand
copies past L2, settled clocks, alternating blocks):

- ``loop``: back-to-back calls from Python, as eager code makes them (the call path's host
  time counts wherever the GPU would wait for it);
- ``graph``: the same calls captured in a CUDA graph, as compiled or graph-captured models run
  them (host time drops out).

Every dense operation is called as a model calls it: a fused entry with its epilogue's
operands (`bias`, the residual `c` or the `gate`, the activation), a scaled fp8 entry with its
scales, each as `matmul` takes them. torch's side is the entry's own baseline (`Baseline.of`:
cuBLAS for a plain GEMM, the eager PyTorch code of the same math otherwise, with fast
accumulation where the entry's kernel accumulates fast, as the sweep pairs them), and for a fused
or scaled entry also the other torch paths of the same math (`Baseline.sides`: torch.compile of
that code, cuBLASLt's own epilogue where it computes it), all timed in the same alternating
blocks; `Delivered.strongest_ratio` is the ratio to the fastest of them. Grouped entries have
their own call site (`cutlass_tune.grouped_mm`; benchmarks/grouped_call_site.py) and are reported
as not checked here.

Each entry's output is checked against an fp32 reference before it is timed.

In another timing regime than back to back (`check_table`'s `regime`: idle gaps, interleaved
copies, a captured duty cycle; cutlass_tune/regime.py) the calls are made from Python with the
regime's work between them and each call is timed between its own CUDA events
(`bench._regimes.time_regime`): the one mode is then the regime's name. An entry's call-site
ratio (`EntryCheck.call_site_ratio`) is the lowest of its modes; an entry is flagged where it falls
more than `GAP` below the table's claim, and `check --table-out` records it in the table, where the
dispatcher holds `min_ratio` against it instead of the claim (`runtime.Match.dispatch_ratio`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._torch import TORCH_DTYPE
from ..measurement import Baseline, TimingMethod
from ..regime import SUSTAINED, RegimeSpec
from ..runtime import BestTable, matmul, torch_gemm
from ..space import Operation, Problem, Scaling
from ..status import Status
from ._env import ClockMonitor
from ._regimes import time_regime
from ._targets import TorchFunction, compiled_function, eager_function, lt_function
from ._timing import TimingOptions, TimingStats, rotation_count
from ._verify import Operands, allocate, compare, randomize, reference

GAP = 0.02
"""A delivered ratio this far below the claimed one (relative) is flagged."""

MODES = ("loop", "graph")


@dataclasses.dataclass(frozen=True)
class Delivered:
    """One calling mode of one entry: `matmul` and torch's call (the entry's baseline), timed
    alternately with the other torch paths of the same math (`others`, by `Baseline` name)."""

    mode: str
    tuned: TimingStats
    torch: TimingStats
    others: dict[str, TimingStats] = dataclasses.field(default_factory=dict)

    @property
    def strongest_ratio(self) -> float:
        """The fastest torch path's median / `matmul`'s median: the baseline and `others`."""
        return min(t.median_ms for t in (self.torch, *self.others.values())) / self.tuned.median_ms

    @property
    def ratio(self) -> float:
        """torch's median / `matmul`'s median (>1: the tuned call is faster)."""
        return self.torch.median_ms / self.tuned.median_ms

    @property
    def ratio_low(self) -> float:
        """The ratio at the slow ends of both spreads (tuned p80 against torch p20)."""
        return self.torch.p20_ms / self.tuned.p80_ms

    @property
    def ratio_high(self) -> float:
        return self.torch.p80_ms / self.tuned.p20_ms


@dataclasses.dataclass(frozen=True)
class EntryCheck:
    """One table entry as the caller gets it: the ratio the table claims, and per mode the
    ratio delivered; `error` says why it could not be measured (then `delivered` is empty)."""

    problem: Problem
    kernel: str
    claimed: float | None
    delivered: tuple[Delivered, ...] = ()
    error: str = ""
    regime: str = SUSTAINED.name
    """The timing regime the modes ran in (`RegimeSpec.name`)."""

    @property
    def call_site_ratio(self) -> float | None:
        """The lowest ratio of its modes (what the caller gets in the worse of them), or None."""
        return min((d.ratio for d in self.delivered), default=None)

    def gap(self, mode: str) -> float | None:
        """(delivered - claimed) / claimed in `mode`, or None where either is missing."""
        found = next((d for d in self.delivered if d.mode == mode), None)
        if found is None or not self.claimed:
            return None
        return found.ratio / self.claimed - 1.0

    @property
    def flagged(self) -> bool:
        """Whether some mode delivers more than `GAP` below the claim."""
        return any((g := self.gap(d.mode)) is not None and g < -GAP for d in self.delivered)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: the problem by name, each mode's ratio and both sides' figures."""
        return {"problem": self.problem.name, "kernel": self.kernel, "claimed": self.claimed, "error": self.error,
                "regime": self.regime, "call_site_ratio": self.call_site_ratio, "flagged": self.flagged,
                "delivered": {d.mode: {"ratio": d.ratio, "ratio_low": d.ratio_low, "ratio_high": d.ratio_high,
                                       "strongest_ratio": d.strongest_ratio,
                                       "sm_mhz": d.tuned.sm_mhz, "power_w": d.tuned.power_w,
                                       "tuned": dataclasses.asdict(d.tuned), "torch": dataclasses.asdict(d.torch),
                                       "others": {k: dataclasses.asdict(v) for k, v in d.others.items()}}
                              for d in self.delivered}}


def problem_of_row(row: dict) -> Problem:
    """The problem a best-table row names, its operation included."""
    return Problem(int(row["m"]), int(row["n"]), int(row["k"]), **Operation.from_cells(row).operation_fields())


def check_table(table: BestTable, *, device: int = 0, options: TimingOptions | None = None,
                modes: tuple[str, ...] = MODES, seed: int = 0,
                regime: RegimeSpec = SUSTAINED) -> Iterator[EntryCheck]:
    """Call every entry of `table` through `matmul` next to torch's call, yielding each
    entry's check as it is known.

    Args:
        table: as a user loads it (`BestTable.load`).
        device: the CUDA device.
        options: the sample budget (the method is sustained whatever it says).
        modes: which of `MODES` to time (back to back; another regime has one mode, its name).
        seed: of the operands' random values.
        regime: what runs between two calls (see the module's docstring).
    """
    torch.cuda.set_device(device)
    options = dataclasses.replace(options or TimingOptions(), method=TimingMethod.SUSTAINED, paired=True)
    monitor = ClockMonitor(device)
    generator = torch.Generator(device=f"cuda:{device}")
    generator.manual_seed(seed)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    for row in table.frame.to_dict("records"):
        problem = problem_of_row(row)
        claimed = row.get("ratio")
        claimed = float(claimed) if claimed is not None and math.isfinite(float(claimed)) else None
        if problem.grouped:
            yield EntryCheck(problem, str(row["kernel"]), claimed, error="a grouped entry: its call site is "
                             "cutlass_tune.grouped_mm (benchmarks/grouped_call_site.py)", regime=regime.name)
            continue
        fast_accum = str(row.get("fp8_fast_accum", "")).lower() in ("true", "1", "1.0")
        try:
            found = _check_entry(table, problem, str(row["kernel"]), claimed, device, options, modes, generator,
                                 monitor, l2, fast_accum, regime)
            yield dataclasses.replace(found, regime=regime.name)
        except (RuntimeError, ValueError) as err:  # torch's CUDA errors, a kernel CUTLASS refuses
            yield EntryCheck(problem, str(row["kernel"]), claimed, error=f"{type(err).__name__}: {err}"[:300],
                             regime=regime.name)


def _check_entry(table: BestTable, problem: Problem, kernel: str, claimed: float | None, device: int,
                 options: TimingOptions, modes: tuple[str, ...], generator: torch.Generator,
                 monitor: ClockMonitor, l2: int, fast_accum: bool = False,
                 regime: RegimeSpec = SUSTAINED) -> EntryCheck:
    first = allocate(problem, f"cuda:{device}")
    randomize(first, generator)
    tuned_call = tuned_function(table, problem)
    verdict = compare(tuned_call(first), reference(first), problem.dtype_d, fp8_inputs=problem.dtype_a.is_fp8)
    if verdict.status is not Status.OK:
        return EntryCheck(problem, kernel, claimed, error=f"matmul's result is wrong: {verdict.reason}")
    paths = torch_functions(problem, first, fast_accum=fast_accum)
    free, _total = torch.cuda.mem_get_info(device)
    copies = [first] + [first.copy() for _ in range(rotation_count(first.nbytes, l2, memory_bytes=free) - 1)]
    sides = [[functools.partial(fn, c) for c in copies] for fn in (tuned_call, *paths.values())]
    names = list(paths)
    delivered = []
    for mode in (modes if regime == SUSTAINED else (regime.name,)):
        found = time_regime(sides, regime, options=options, probe=monitor.reading, capture=mode == "graph",
                            names=["matmul", *(f"torch ({name})" for name in names)])
        delivered.append(Delivered(mode, found[0], found[1], dict(zip(names[1:], found[2:], strict=True))))
    return EntryCheck(problem, kernel, claimed, tuple(delivered))


OperandsCall = Callable[[Operands], torch.Tensor]
"""A call of one side on one copy of the operands, returning a new tensor as the caller's code does."""


def tuned_function(table: BestTable, problem: Problem) -> OperandsCall:
    """`matmul` as a model calls it for `problem`: the epilogue's operands (the bias, the residual
    or the gate, both held in `Operands.c`), its activation and, for a scaled fp8 problem, the
    scales."""
    out_dtype = TORCH_DTYPE[problem.dtype_d]
    epilogue, scaled = problem.epilogue, problem.scaling is not Scaling.NONE

    def call(ops: Operands) -> torch.Tensor:
        return matmul(ops.a_mk, ops.b_kn, table=table, out_dtype=out_dtype, bias=ops.bias,
                      activation=epilogue.activation, c=None if epilogue.gated else ops.c,
                      gate=ops.c if epilogue.gated else None, scale_a=ops.scale_a if scaled else None,
                      scale_b=ops.scale_b if scaled else None, min_ratio=0.0)
    return call


def torch_functions(problem: Problem, ops: Operands, *, fast_accum: bool = False) -> dict[str, OperandsCall]:
    """torch's paths for `problem`'s math, by `Baseline` name, the entry's own baseline first
    (`Baseline.of`), each made once on `ops` (for torch.compile, its compile): cuBLAS as torch
    calls it for a plain GEMM (`torch_gemm`); otherwise the eager code (bench's `eager_function`,
    with fast accumulation where the entry's kernel has it, as the sweep paired them), then each of
    `Baseline.sides` that computes the same function. A side torch cannot make is left out."""
    own = Baseline.of(problem)
    if own is Baseline.CUBLAS:
        out_dtype = TORCH_DTYPE[problem.dtype_d]
        return {own.value: lambda o: torch_gemm(o.a_mk, o.b_kn, out_dtype)}
    unit = torch.ones((), dtype=torch.float32, device=ops.a.device)
    # unscaled fp8 runs torch._scaled_mm with unit scales, as the sweep's baseline does
    own_scales = problem.scaling is not Scaling.NONE or not problem.dtype_a.is_fp8
    makers = {Baseline.EAGER: eager_function, Baseline.COMPILE: compiled_function, Baseline.CUBLASLT: lt_function}
    paths: dict[str, OperandsCall] = {}
    for kind in (own, *own.sides):
        if not kind.applies(problem) or (kind is Baseline.CUBLASLT and not ops.d.is_cuda):
            continue
        fn = makers[kind](problem, fast_accum=fast_accum)

        def call(o: Operands, fn: TorchFunction = fn) -> torch.Tensor:
            return fn(o.a_mk, o.b_kn, o.bias, o.c, o.scale_a if own_scales else unit,
                      o.scale_b if own_scales else unit)
        try:
            call(ops)
        except Exception:  # noqa: BLE001 - the entry's own baseline must run; a side torch refuses is left out
            if kind is own:
                raise
            continue
        paths[kind.value] = call
    return paths
