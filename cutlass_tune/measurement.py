"""The records of a measurement, free of torch and of the GPU: `Measurement` (the outcome of one
(kernel, problem, run-time variant)), the `EnvStamp` and `Clocks` it carries, and its JSON lines;
how figures were timed (`TimingScheme`) and what each timing method is (`METHOD_FACTS`).

The bench stage produces these; the store, search and report stages read them without importing
the GPU code. Each line of a results file is one `Measurement.to_dict()`, carrying a `schema`
number. `tests/bench/data/` keeps a file from each schema version; `from_dict` must keep loading
them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .space import (
    ACTIVATIONS,
    Grouping,
    Inputs,
    KernelConfig,
    KindRegistry,
    NodeKind,
    Operation,
    Problem,
    RuntimeArgs,
    Scaling,
)
from .status import Status

# nvmlClocksEventReason* bits (formerly nvmlClocksThrottleReason*), fixed by the NVML ABI.
THROTTLE_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "sw_power_cap"})
"""Reasons that do not mark a measurement throttled. A dense GEMM on an H100/H200 runs at the
board's power limit (on the H200 host every one of 339 measurements on 2026-11-21 had
sw_power_cap set, at 1500-1620 MHz): the clock a kernel sustains there is part of its speed.
Thermal and hardware slowdowns are not, and mark the measurement."""


def decode_reasons(mask: int) -> tuple[str, ...]:
    """Names of the throttle-reason bits set in `mask` (unknown bits as hex)."""
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_REASONS.get(bit, f"0x{bit:x}"))
        bit <<= 1
    return tuple(names)


class TimingMethod(str, enum.Enum):
    """How a measurement's launches were timed (see `bench._timing` and docs/timing.md); what
    each method is for the other stages is its `facts`."""

    EVENTS = "events"
    GRAPH = "graph"
    SUSTAINED = "sustained"

    @property
    def facts(self) -> MethodFacts:
        return METHOD_FACTS[self]


@dataclasses.dataclass(frozen=True)
class MethodFacts:
    """What a timing method is, for the stages that choose, compare and show its figures."""

    note: str
    """What it times, in a few words for people (the dashboard)."""
    rank: int
    """Trust order (0 first) where a problem was confirmed by several methods (`report.RANKING`)."""
    races: bool
    """Whether a sweep races a kernel's variants under it (bench/_race.py)."""


METHOD_FACTS = {
    # Sustained ranks first: it agreed with the ratio delivered through `matmul` where single
    # launches read up to 8% high (benchmarks/sustained.md). It does not race: a brief sustained
    # sample would be dominated by its settling run.
    TimingMethod.SUSTAINED: MethodFacts(note="back-to-back launches at settled clocks", rank=0, races=False),
    TimingMethod.GRAPH: MethodFacts(note="CUDA-graph replays (warm L2)", rank=1, races=True),
    TimingMethod.EVENTS: MethodFacts(note="L2-cold CUDA events", rank=2, races=True),
}

PAIRED_SUFFIX = "-paired"


@dataclasses.dataclass(frozen=True)
class TimingScheme:
    """How a store's figures were timed: the method, and whether each kernel's baseline was
    sampled alternately with it (`paired`, see `bench._timing`). Figures of different schemes
    do not compare, so a store holds one (`ResultStore.bind_timing`), by its `name`."""

    method: TimingMethod
    paired: bool = False

    @property
    def name(self) -> str:
        """The method's name, `-paired` appended when paired ("events-paired"): the text a
        store holds; `parse` reads it back."""
        return self.method.value + (PAIRED_SUFFIX if self.paired else "")

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> TimingScheme:
        """The scheme `name`d `text`. Raises ValueError (one line) for any other text."""
        method = text.removesuffix(PAIRED_SUFFIX)
        if method not in {m.value for m in TimingMethod}:
            methods = ", ".join(m.value for m in TimingMethod)
            raise ValueError(f"unknown timing scheme {text!r:.60}: use a method ({methods}), "
                             f"with {PAIRED_SUFFIX} appended where baselines are paired")
        return cls(TimingMethod(method), paired=method != text)


@dataclasses.dataclass(frozen=True)
class Clocks:
    """GPU state read through NVML. Fields NVML does not report on a device are None."""

    sm_mhz: int | None = None
    mem_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    reasons: tuple[str, ...] = ()

    @property
    def throttled(self) -> bool:
        return any(r not in BENIGN_REASONS for r in self.reasons)

    @classmethod
    def around(cls, before: Clocks | None, after: Clocks | None) -> Clocks | None:
        """One record for a measurement: the readings after it, and every throttle reason seen
        before or after it."""
        if after is None:
            return before
        if before is None:
            return after
        reasons = tuple(sorted(set(before.reasons) | set(after.reasons)))
        return dataclasses.replace(after, reasons=reasons)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Clocks:
        return cls(**{**data, "reasons": tuple(data.get("reasons", ()))})


@dataclasses.dataclass(frozen=True)
class EnvStamp:
    """The machine and software a measurement ran on. Versions that cannot be read are None."""

    host: str
    gpu: str
    capability: str
    sm_count: int
    l2_bytes: int
    driver: str | None
    cuda_runtime: str | None
    torch: str
    nvcc: str | None
    cutlass: str | None
    device: int | None = None
    """CUDA device index in the measuring process (None in records older than multi-GPU sweeps)."""
    gpu_uuid: str | None = None
    """Which board it was, where a host has several of one model."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvStamp:
        return cls(**data)


SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
"""Schema 2 added the paired baseline fields (`baseline_median_ms` ...); a schema-1 record
reads with them unset. Fields added since (the problem's epilogue and scaling, `compile_*`,
a grouped problem's experts, `loop_*` and `dense_*`) read as their defaults from records
without them."""
BASELINE_NAME = "cuBLAS"


class Baseline(str, enum.Enum):
    """What a problem's baseline is, by the name its rows carry (`Measurement.kernel_name`).

    CUBLAS: a plain problem's, torch.matmul (torch._scaled_mm with unit scales for fp8), as
    before fused epilogues. EAGER: a problem with a fused epilogue or fp8 scales: the PyTorch
    code a user writes for the same math (`F.linear` with its bias, then the activation;
    `torch._scaled_mm` with the scales). COMPILE: `torch.compile` of that same function, timed in
    the eager baseline's sampling loop; its figures are the eager row's `compile_*` fields.
    CUBLASLT: cuBLASLt's own epilogue where it computes the problem's function
    (`torch._addmm_activation`: bias + ReLU, bias + tanh GELU on 16-bit inputs; `applies`),
    timed in the same loop; its figures are the eager row's `lt_*` fields. The strongest of the
    three (`Measurement.strongest`) is what a fused kernel must beat to count as a winner.

    A grouped problem's (`Problem.grouped`): GROUPED_MM, torch's grouped GEMM
    (`torch._grouped_mm`, which `F.grouped_mm` calls) on the same operands, the one its kernels
    are paired with and ranked against. Timed in its sampling loop and reported on its row:
    EXPERT_LOOP, one torch.matmul per expert (`loop_*`), and DENSE, one torch.matmul of the
    whole M x N x K (`dense_*`: the same FLOPs without the grouping, a ceiling, never a
    baseline to win against).
    """

    CUBLAS = BASELINE_NAME
    EAGER = "torch eager"
    COMPILE = "torch.compile"
    CUBLASLT = "cuBLASLt epilogue"
    GROUPED_MM = "torch._grouped_mm"
    EXPERT_LOOP = "torch expert loop"
    DENSE = "torch dense"

    @classmethod
    def of(cls, problem: Operation) -> Baseline:
        """The baseline a problem's (or an operation's) kernels are paired with and ranked against,
        as its kind's entry of `BASELINES` says."""
        return BASELINES[problem.kind](problem)

    @property
    def sides(self) -> tuple[Baseline, ...]:
        """The torch paths timed in this baseline's own sampling loop, whose figures its row
        carries (`SIDE_FIELDS`): torch.compile beside eager, the expert loop and the dense GEMM
        beside torch._grouped_mm."""
        return _SIDES.get(self, ())

    def applies(self, problem: Operation) -> bool:
        """Whether this torch path computes `problem`'s function (every one does but CUBLASLT,
        which computes a bias with ReLU or tanh GELU on 16-bit inputs into their own type, and
        nothing else: no residual, gate, scaling or erf GELU; and the expert loop and the dense
        GEMM, which are written for the forward's experts, not their weight gradients)."""
        if self in (Baseline.EXPERT_LOOP, Baseline.DENSE):  # the forward's sides; not built for dW
            return problem.grouping is not Grouping.GROUPED_K
        if self is not Baseline.CUBLASLT:
            return True
        e = problem.epilogue
        return (not problem.grouped and e.tree().kinds == _LT_NODES and e.activation in LT_ACTIVATIONS
                and problem.scaling is Scaling.NONE
                and not problem.dtype_a.is_fp8 and problem.dtype_d is problem.dtype_a is problem.dtype_b)


_SIDES = {Baseline.EAGER: (Baseline.COMPILE, Baseline.CUBLASLT),
          Baseline.GROUPED_MM: (Baseline.EXPERT_LOOP, Baseline.DENSE)}

BASELINES: KindRegistry[Callable[[Operation], Baseline]] = KindRegistry("baseline")
"""Each kind's baseline (`Baseline.of`), by its grouping: a single GEMM's is cuBLAS where the
operation is plain, torch eager where it has a fused epilogue or fp8 scales; a grouped one's
torch._grouped_mm."""
BASELINES.add(lambda op: Baseline.CUBLAS if op.is_plain else Baseline.EAGER, grouping=Grouping.NONE)
BASELINES.add(lambda op: Baseline.GROUPED_MM, grouping=Grouping.GROUPED)
BASELINES.add(lambda op: Baseline.GROUPED_MM, grouping=Grouping.GROUPED_K)

LT_ACTIVATIONS = frozenset(a for a, facets in ACTIVATIONS.items() if facets.cublaslt)
"""The activations cuBLASLt's epilogue computes as torch defines them (`_addmm_activation`'s
`use_gelu` is the tanh form on CUDA)."""
_LT_NODES = (NodeKind.ACCUMULATOR, NodeKind.SCALE, NodeKind.BIAS, NodeKind.ACTIVATION)
"""cuBLASLt's epilogue: alpha * acc + bias by column, then the activation, nothing else."""

CONTENDERS = {Baseline.EAGER: (Baseline.EAGER, Baseline.COMPILE, Baseline.CUBLASLT)}
"""The torch paths that compute a baseline row's function, of which the fastest is the one a kernel
must beat (`Measurement.strongest`); a baseline not named here is its own only contender (the
dense GEMM beside torch._grouped_mm is a ceiling, not a path of the same function), but for
`contenders`' one exception."""


def contenders(own: Baseline, problem: Operation) -> tuple[Baseline, ...]:
    """The torch paths of `problem`'s baseline row `own` that compute its function (`CONTENDERS`).
    A block-wise fp8 grouped problem has no one torch path (torch has no block-wise grouped GEMM
    on SM90): torch._grouped_mm after dequantizing and the per-expert loop of torch._scaled_mm
    both contend. A 16-bit grouped problem's expert loop does not: torch._grouped_mm is its path.
    Each kind's are `KIND_CONTENDERS`'."""
    return KIND_CONTENDERS[problem.kind].get(own, ())


KIND_CONTENDERS: KindRegistry[Mapping[Baseline, tuple[Baseline, ...]]] = KindRegistry("contenders")
"""`CONTENDERS` by kind: the same for every kind but block-wise fp8 grouped (`contenders`)."""
KIND_CONTENDERS.add(CONTENDERS)
KIND_CONTENDERS.add({**CONTENDERS, Baseline.GROUPED_MM: (Baseline.GROUPED_MM, Baseline.EXPERT_LOOP)},
                    grouping=Grouping.GROUPED, inputs=Inputs.FP8_BLOCKWISE)

SIDE_FIELDS = {Baseline.COMPILE: "compile", Baseline.CUBLASLT: "lt", Baseline.EXPERT_LOOP: "loop",
               Baseline.DENSE: "dense"}
"""The prefix of a baseline row's fields (`compile_median_ms`, `loop_p20_ms`, ...) for each side
timed in its loop (`Baseline.sides`)."""


BASELINE_NAMES = frozenset(b.value for b in Baseline)
"""Every `kernel` name a baseline row has in a store (a kernel's name is never one of them)."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One (kernel, problem, run-time variant) measured, or why it could not be.

    Timing fields are set only when `status` is OK or UNSTABLE (timed, but too noisy to rank).
    `config` is None for the cuBLAS baseline (`is_baseline`) and for hand-written kernels, which
    `symbol` then names. `method` says how it was timed (see `_timing`); only measurements with
    the same method, `env` and run compare. `repeat` numbers the passes of a run that measures
    everything more than once. The `baseline_*` fields are set when the cuBLAS baseline of the
    problem was timed in the same sampling loop, alternately with this kernel (paired timing);
    `paired_ratio` is then this kernel's speed relative to it.
    """

    problem: Problem
    config: KernelConfig | None
    runtime: RuntimeArgs
    status: Status
    reason: str = ""
    symbol: str = ""
    is_baseline: bool = False
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    samples: int = 0
    tflops: float | None = None
    rel_error: float | None = None
    worst_error: float | None = None
    """The largest error of one output element, in units of the reference's RMS (absent from
    records written before it was kept)."""
    method: str = ""
    throttled: bool = False
    clocks: Clocks | None = None
    env: EnvStamp | None = None
    compile_seconds: float | None = None
    repeat: int = 0
    baseline_median_ms: float | None = None
    baseline_p20_ms: float | None = None
    baseline_p80_ms: float | None = None
    energy_mj: float | None = None
    """Millijoules the board drew per launch, and the median SM clock meanwhile (sustained
    timing with NVML; the `baseline_` ones for the paired cuBLAS baseline)."""
    sm_mhz: float | None = None
    baseline_energy_mj: float | None = None
    baseline_sm_mhz: float | None = None
    power_w: float | None = None
    """The board's mean power while this side ran alone in its regime (sustained timing with
    NVML; `baseline_power_w` for the paired baseline)."""
    baseline_power_w: float | None = None
    regime: str = ""
    """The timing regime's name (`RegimeSpec.name`: "sustained", "idle-gap:200us", ...) of a
    measurement timed by the sustained method, or "in-model:compiled:4096" of one `tune-model`
    timed inside a model's step (torch.profiler's kernel times, a call's share of a step; `method`
    ""); "" for single launches and graph replays, and in records written before regimes (which
    were all back to back)."""
    compile_median_ms: float | None = None
    """On the `Baseline.EAGER` row of a problem: `torch.compile` of the same function, timed
    alternately with eager in the row's own sampling loop (None where it could not be; `reason`
    then says why). Kernels are paired with eager only; `to_compile` carries their ratio over."""
    compile_p20_ms: float | None = None
    compile_p80_ms: float | None = None
    lt_median_ms: float | None = None
    """On the `Baseline.EAGER` row of a problem cuBLASLt's epilogue computes (`Baseline.applies`):
    `torch._addmm_activation`, timed in the row's sampling loop beside eager and torch.compile."""
    lt_p20_ms: float | None = None
    lt_p80_ms: float | None = None
    loop_median_ms: float | None = None
    """On the `Baseline.GROUPED_MM` row of a grouped problem: a loop of torch.matmul over the
    experts, timed alternately with torch._grouped_mm in the row's sampling loop (None where it
    could not be; `reason` then says why)."""
    loop_p20_ms: float | None = None
    loop_p80_ms: float | None = None
    dense_median_ms: float | None = None
    """On the `Baseline.GROUPED_MM` row: one dense torch.matmul of M x N x K (the same FLOPs,
    no grouping), timed in the same loop: the ceiling a grouped GEMM approaches."""
    dense_p20_ms: float | None = None
    dense_p80_ms: float | None = None

    @property
    def paired_ratio(self) -> float | None:
        """cuBLAS median / this median from the same sampling loop (>1: faster than cuBLAS),
        or None when the baseline was not paired or the measurement failed."""
        if self.status is not Status.OK or not self.baseline_median_ms or not self.median_ms:
            return None
        return self.baseline_median_ms / self.median_ms

    @property
    def baseline_tflops(self) -> float | None:
        """TFLOP/s of the paired cuBLAS baseline, or None."""
        if not self.baseline_median_ms:
            return None
        return self.problem.flops / (self.baseline_median_ms * 1e9)

    @property
    def compile_tflops(self) -> float | None:
        """TFLOP/s of torch.compile on an eager baseline row, or None."""
        if not self.compile_median_ms:
            return None
        return self.problem.flops / (self.compile_median_ms * 1e9)

    @property
    def compile_ratio(self) -> float | None:
        """On an eager baseline row: eager median / torch.compile median from its sampling loop
        (>1: torch.compile is faster), or None."""
        if self.status is not Status.OK or not self.compile_median_ms or not self.median_ms:
            return None
        return self.median_ms / self.compile_median_ms

    def side_tflops(self, side: Baseline) -> float | None:
        """TFLOP/s of a side timed in this baseline row's loop (`Baseline.sides`), or None."""
        median = getattr(self, f"{SIDE_FIELDS[side]}_median_ms")
        return self.problem.flops / (median * 1e9) if median else None

    def side_ratio(self, side: Baseline) -> float | None:
        """This baseline row's median / the median of `side` from the same sampling loop (>1:
        the side is faster), or None. On a GROUPED_MM row, EXPERT_LOOP's is below 1 where
        torch._grouped_mm beats the loop; DENSE's says how far the dense ceiling sits above it."""
        median = getattr(self, f"{SIDE_FIELDS[side]}_median_ms")
        if self.status is not Status.OK or not median or not self.median_ms:
            return None
        return self.median_ms / median

    def strongest(self) -> tuple[Baseline, float] | None:
        """On a baseline row: the fastest torch path of the same function timed in its loop
        (`contenders`: eager, torch.compile and cuBLASLt's epilogue on an eager row; with the expert
        loop on a block-wise fp8 grouped row; the row's own baseline elsewhere), and this row's
        median over its median (>= 1). None where the row was not timed."""
        if not self.is_baseline or self.status is not Status.OK or not self.median_ms:
            return None
        own = Baseline(self.kernel_name) if self.kernel_name in BASELINE_NAMES else Baseline.CUBLAS
        best, best_ms = own, self.median_ms
        for side in contenders(own, self.problem):
            median = self.median_ms if side is own else getattr(self, f"{SIDE_FIELDS[side]}_median_ms")
            if median and median < best_ms:
                best, best_ms = side, median
        return best, self.median_ms / best_ms

    def to_strongest(self, ratio_to_own: float) -> tuple[Baseline, float] | None:
        """A kernel's speed relative to the strongest torch path (`strongest`), from its ratio to
        this baseline row's own path in the same pass (as `to_compile`), with that path; None
        where this row was not timed."""
        found = self.strongest()
        return None if found is None else (found[0], ratio_to_own / found[1])

    def to_compile(self, ratio_to_eager: float) -> float | None:
        """A kernel's speed relative to torch.compile (>1: faster), from its `ratio_to_eager`
        and this eager baseline row of the same pass: the two torch paths were timed in one
        loop, so the clock's drift between the kernel's loop and this one cancels as it does
        in the ratio to eager. None where this row has no torch.compile figures."""
        return None if self.compile_ratio is None else ratio_to_eager / self.compile_ratio

    @property
    def kernel_name(self) -> str:
        if self.is_baseline:
            return self.symbol or BASELINE_NAME
        return self.config.name if self.config is not None else self.symbol

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict; inverse of `from_dict`."""
        out: dict[str, Any] = {"schema": SCHEMA_VERSION}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "problem":
                v = v.to_dict()
            elif f.name == "runtime":
                v = v.to_dict()
            elif f.name == "status":
                v = v.value
            elif v is not None and f.name in ("config", "clocks", "env"):
                v = v.to_dict()
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Build from `to_dict` output of any known schema. Raises ValueError otherwise."""
        schema = data.get("schema")
        if schema not in READABLE_SCHEMAS:
            raise ValueError(f"unknown measurement schema {schema!r} (this version reads "
                             f"{', '.join(map(str, READABLE_SCHEMAS))})")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["problem"] = Problem.from_dict(data["problem"])
        values["runtime"] = RuntimeArgs.from_dict(data["runtime"])
        values["status"] = Status(data["status"])
        for name, kind in (("config", KernelConfig), ("clocks", Clocks), ("env", EnvStamp)):
            if data.get(name) is not None:
                values[name] = kind.from_dict(data[name])
        return cls(**values)


def write_jsonl(stream: IO[str], measurement: Measurement) -> None:
    """Append one line and flush it, so an interruption loses nothing already measured."""
    stream.write(json.dumps(measurement.to_dict()) + "\n")
    stream.flush()


def read_jsonl(path: str | Path) -> Iterator[Measurement]:
    """Measurements of a results file, in order. Raises ValueError naming a bad line."""
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Measurement.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{number}: not a measurement: {err}") from err
