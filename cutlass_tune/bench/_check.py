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

Each entry's output is checked against an fp32 reference before it is timed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._torch import TORCH_DTYPE
from ..measurement import TimingMethod
from ..runtime import BestTable, matmul, torch_gemm
from ..space import Operation, Problem
from ..status import Status
from ._env import ClockMonitor
from ._timing import TimingOptions, TimingStats, rotation_count, time_sustained
from ._verify import Operands, allocate, compare, randomize, reference

GAP = 0.02
"""A delivered ratio this far below the claimed one (relative) is flagged."""

MODES = ("loop", "graph")


@dataclasses.dataclass(frozen=True)
class Delivered:
    """One calling mode of one entry: `matmul` and torch's call, timed alternately."""

    mode: str
    tuned: TimingStats
    torch: TimingStats

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
                "delivered": {d.mode: {"ratio": d.ratio, "ratio_low": d.ratio_low, "ratio_high": d.ratio_high,
                                       "tuned": dataclasses.asdict(d.tuned), "torch": dataclasses.asdict(d.torch)}
                              for d in self.delivered}}


def problem_of_row(row: dict) -> Problem:
    """The problem a best-table row names, its operation included."""
    return Problem(int(row["m"]), int(row["n"]), int(row["k"]), **Operation.from_cells(row).operation_fields())


def check_table(table: BestTable, *, device: int = 0, options: TimingOptions | None = None,
                modes: tuple[str, ...] = MODES, seed: int = 0) -> Iterator[EntryCheck]:
    """Call every entry of `table` through `matmul` next to torch's call, yielding each
    entry's check as it is known.

    Args:
        table: as a user loads it (`BestTable.load`).
        device: the CUDA device.
        options: the sample budget (the method is sustained whatever it says).
        modes: which of `MODES` to time.
        seed: of the operands' random values.
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
        try:
            yield _check_entry(table, problem, str(row["kernel"]), claimed, device, options, modes, generator,
                               monitor, l2)
        except (RuntimeError, ValueError) as err:  # torch's CUDA errors, a kernel CUTLASS refuses
            yield EntryCheck(problem, str(row["kernel"]), claimed, error=f"{type(err).__name__}: {err}"[:300])


def _check_entry(table: BestTable, problem: Problem, kernel: str, claimed: float | None, device: int,
                 options: TimingOptions, modes: tuple[str, ...], generator: torch.Generator,
                 monitor: ClockMonitor, l2: int) -> EntryCheck:
    first = allocate(problem, f"cuda:{device}")
    randomize(first, generator)
    out_dtype = TORCH_DTYPE[problem.dtype_d]
    verdict = compare(matmul(first.a_mk, first.b_kn, table=table, out_dtype=out_dtype), reference(first),
                      problem.dtype_d, fp8_inputs=problem.dtype_a.is_fp8)
    if verdict.status is not Status.OK:
        return EntryCheck(problem, kernel, claimed, error=f"matmul's result is wrong: {verdict.reason}")
    free, _total = torch.cuda.mem_get_info(device)
    copies = [first] + [first.copy() for _ in range(rotation_count(first.nbytes, l2, memory_bytes=free) - 1)]
    tuned = [_call(lambda a, b: matmul(a, b, table=table, out_dtype=out_dtype), c) for c in copies]
    theirs = [_call(lambda a, b: torch_gemm(a, b, out_dtype), c) for c in copies]
    delivered = []
    for mode in modes:
        found = time_sustained([tuned, theirs], options=options, probe=monitor.reading, capture=mode == "graph")
        delivered.append(Delivered(mode, found[0], found[1]))
    return EntryCheck(problem, kernel, claimed, tuple(delivered))


def _call(gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ops: Operands) -> Callable[[], object]:
    a, b = ops.a_mk, ops.b_kn
    return lambda: gemm(a, b)
