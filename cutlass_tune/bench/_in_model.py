"""The GPU side of `tune-model`: a model's step, run on a table of candidates, profiled and timed.

The decisions (which candidates, which step runs which, which kept) are `search/_in_model.py`'s;
this module runs them. Every table a step runs is bound to one key (`TABLE_KEY`, the one the
"cutlass_tune" experts read), so switching candidates between steps is one `register_table`:
the same weights, the same compiled graph (the operators take the key, a constant, and look the
table up at each call). The model's Linears are patched onto that key too (`patch` with
`min_ratio=0`: every covered layer runs the table's kernel; the table decides per step).

Modes: eager (the forward under no_grad), compiled (`torch.compile` of the model, default mode),
graphs (the compiled step captured in a CUDA graph and replayed, as a server's decode runs). A
replay runs the kernels captured with the table bound at capture and opens none of the doors'
ranges, which the candidates' kernel times are attributed by: in graphs mode the candidates rotate
in the compiled step, and the A/B replays each side's step captured with its own table (`graphed`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from ..capture import Target, _moved, _moved_model, _users_code
from ..compile import KernelCache, compile_kernels
from ..regime import StepMode as Mode
from ..runtime._op import register_table
from ..runtime._patch import patch
from ..runtime._table import BestTable
from ..search._in_model import STEP_PREFIX, StepSplit, step_split
from ..space import KernelConfig
from ._env import ClockMonitor
from ._timing import Reading, _capture, power_between

TABLE_KEY = "cutlass_tune.transformers"
"""The key every step's table is bound to: `cutlass_tune.transformers.TABLE_KEY`, which the
"cutlass_tune" experts read (spelt here so that a model without transformers needs none)."""


def bind(table: BestTable) -> None:
    """Make `table` the one every door of the model reads from now on (`TABLE_KEY`)."""
    register_table(table, key=TABLE_KEY)
    # Before the model's file is imported (tune-model binds first, then loads the target), so
    # transformers installed counts, not transformers imported.
    if "transformers" not in sys.modules and importlib.util.find_spec("transformers") is None:
        return
    try:
        import cutlass_tune.transformers as ct
    except ImportError:  # transformers too old for the experts: none to tell
        return
    ct.use_table(table)


def plan_experts(model: torch.nn.Module) -> int:
    """Plan the model's transformers experts modules in eager code, as `use_table(table,
    model=...)` does, so a compiled step reads each kept plan instead of tracing how it is made
    (and guarding all it read on every call); where `bind` bound the experts interface. Returns
    how many were planned."""
    if "cutlass_tune.transformers" not in sys.modules:
        return 0
    import cutlass_tune.transformers as ct

    return ct.plan_experts(model)


def build_step(target: Target, mode: Mode, *, patched: bool = True) -> Callable[[], object]:
    """The model's step: its forward under no_grad on its inputs, on the current GPU; its Linears
    patched onto `TABLE_KEY` (bind a table first; not for a baseline model, `patched` False),
    compiled in `Mode.COMPILED`."""
    device = torch.device("cuda", torch.cuda.current_device())
    with _users_code():
        model = _moved_model(target.model, device)
    args, kwargs = _moved(target.args, device), _moved(target.kwargs, device)
    if isinstance(model, torch.nn.Module):
        model.eval()
        if patched:
            patch(model, TABLE_KEY, min_ratio=0.0, min_kernel_us=0.0)
            plan_experts(model)
    run = torch.compile(model) if mode in (Mode.COMPILED, Mode.GRAPHS) else model

    def step() -> object:
        with torch.no_grad():
            return run(*args, **kwargs)

    return step


def graphed(step: Callable[[], object]) -> Callable[[], object]:
    """`step` captured in a CUDA graph with the table bound now (`_timing._capture`: warmed on a
    side stream, every plan resolved, then captured once); the result replays it (the same
    inputs, the step's output in the graph's own memory)."""
    graph = _capture(step, 1)
    torch.cuda.synchronize()
    return graph.replay


def precompile(rows: Sequence[pd.Series]) -> None:
    """Compile the kernels of the candidates' rows in parallel (a kernel a step meets first would
    compile on one core inside the step); those compiled before are found in the cache."""
    configs = {}
    for row in rows:
        cfg = KernelConfig.from_dict(json.loads(row["config"]))
        configs[cfg.hash] = cfg
    if configs:
        compile_kernels(list(configs.values()), cache=KernelCache.at(None))


def profiled_steps(step: Callable[[], object], tables: Sequence[BestTable], rounds: int,
                   watch: BoardWatch | None = None) -> list[Any]:
    """Run the steps (table i in step i of each round: step r * len(tables) + i) once unprofiled
    (to load every kernel), then `rounds` rounds under torch.profiler (CUPTI kernel times), each
    step in its range `STEP_PREFIX<index>`. Returns the profiler's events. torch's step says
    nothing of its fp8 rows held to torch's path (`TORCH_HELD`: the dispatcher would call each
    "measured at 0.000x torch inside the model"). `watch` reads the board over the profiled
    rounds alone: not over the first steps (a compile of the model leaves the GPU idle for
    seconds) nor the profiler's collection after them, whose idle time read an H200 at 1,980 MHz
    and 143 W for a compiled step that holds it at its power cap."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".* was measured at 0\.000x torch inside the model",
                                category=RuntimeWarning)
        for table in tables:
            bind(table)
            step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with watch if watch is not None else contextlib.nullcontext():
            for r in range(rounds):
                for i, table in enumerate(tables):
                    bind(table)
                    with torch.profiler.record_function(f"{STEP_PREFIX}{r * len(tables) + i}"):
                        step()
            torch.cuda.synchronize()
    return list(prof.events())


class BoardWatch:
    """The board's SM clock and power while a block of steps runs (`with BoardWatch(device):`),
    from NVML (`ClockMonitor`): a thread reads it every `poll_s`; after the block, `sm_mhz` is
    the median clock read and `power_w` the energy between the first and the last update of NVML's
    counter over the time between them (its updates come about every 100 ms). Each is NaN where
    NVML reports none, or the block was too short for a power figure (`POWER_MIN_WINDOW_S`).
    Costs the profiled steps nothing but a thread that sleeps between reads."""

    def __init__(self, device: int, poll_s: float = 0.005, clock: Callable[[], float] = time.perf_counter):
        self._monitor = ClockMonitor(device)
        self._poll_s, self._clock = poll_s, clock
        self._stop = threading.Event()
        self._clocks: list[float] = []
        self._updates: list[tuple[float, float]] = []
        self._thread: threading.Thread | None = None
        self.sm_mhz = math.nan
        self.power_w = math.nan

    def _read(self) -> Reading:
        return self._monitor.reading()

    def _poll(self) -> None:
        previous = None
        while not self._stop.is_set():
            reading = self._read()
            if reading.sm_mhz is not None:
                self._clocks.append(float(reading.sm_mhz))
            if reading.energy_mj is not None and reading.energy_mj != previous:
                if previous is not None:
                    self._updates.append((self._clock(), float(reading.energy_mj)))
                previous = reading.energy_mj
            self._stop.wait(self._poll_s)

    def __enter__(self) -> BoardWatch:
        if self._read() != Reading():  # NVML reports something: watch it
            self._thread = threading.Thread(target=self._poll, name="board-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join()
        if self._clocks:
            self.sm_mhz = statistics.median(self._clocks)
        power = power_between(self._updates)
        if power is not None:
            self.power_w = power


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the A/B: ms per step of each block."""

    label: str
    blocks_ms: tuple[float, ...]
    split: StepSplit | None = None
    """Its kernel time per step by kind, from profiled steps (None: not profiled)."""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.blocks_ms)

    @property
    def spread(self) -> float:
        """(p80 - p20) / median of the blocks."""
        q = statistics.quantiles(self.blocks_ms, n=5, method="inclusive") if len(self.blocks_ms) > 1 else [0, 0, 0, 0]
        return (q[3] - q[0]) / self.median_ms


def _block_ms(step: Callable[[], object], count: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / count


def profiled_split(step: Callable[[], object], count: int = 5) -> StepSplit:
    """The kernel time per step of `count` steps under torch.profiler, GEMMs apart (`step_split`)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(count):
            step()
        torch.cuda.synchronize()
    return step_split(prof.events(), count)


def ab(steps: Mapping[str, tuple[Callable[[], object], BestTable]], *, blocks: int = 10, block: int = 5,
       profile: bool = True) -> list[Side]:
    """Each side's step (a step and the table bound while it runs), in alternating blocks of
    `block` steps (CUDA events), after one warm block each; then, with `profile`, its kernel time
    by kind: the median of `block` profiled steps, one of each side in turn."""
    for step, table in steps.values():
        bind(table)
        _block_ms(step, 2)
    times: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(blocks):
        for label, (step, table) in steps.items():
            bind(table)
            times[label].append(_block_ms(step, block))
    splits: dict[str, StepSplit | None] = dict.fromkeys(steps)
    if profile:
        # one profiled step of each side in turn, `block` rounds: each side's kernels at the clocks
        # the others meet (profiling one side's steps after another's read 14% apart on an H200)
        got: dict[str, list[StepSplit]] = {label: [] for label in steps}
        for _ in range(block):
            for label, (step, table) in steps.items():
                bind(table)
                got[label].append(profiled_split(step, 1))
        splits = {label: StepSplit(statistics.median(s.gemm_us for s in v), statistics.median(s.other_us for s in v))
                  for label, v in got.items()}
    return [Side(label, tuple(v), splits[label]) for label, v in times.items()]


def clock() -> float:
    """Seconds on the host's monotonic clock, after the GPU is done."""
    torch.cuda.synchronize()
    return time.perf_counter()
