"""Inside the worker process: run a `Job` on one GPU and yield a `Measurement` per variant.

For each variant: fresh random inputs, an fp32 reference, `can_implement`, workspace sized
by the kernel, `initialize` once, one launch into a NaN-poisoned output checked against the
reference, then the launches timed by `time_sides` (the same function for cuBLAS; with
paired timing the problem's baseline is sampled alternately with the kernel; a baseline row's
sides, `Baseline.sides`, alternately with the baseline), then the output checked again (a
kernel can be right once and wrong when repeated).

A timing whose samples scatter widely (`UNSTABLE_SPREAD`, on either side of a pair) is taken
once more; if it scatters again the variant is UNSTABLE, not OK (its figures kept), so that a
disturbed run never ranks. Seen here twice at 128^3-512^3 while nvcc compiled the next batch
(host time inside the events of 6 us launches is the likely cause; plain CPU load did not
reproduce it, see benchmarks/beat_cublas.md).

A CUDA error yields RUNTIME_ERROR; the CUDA context may then be lost for good, so the worker
loop exits after sending it (see `_worker`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .._torch import expand_blockwise_scale_b
from ..kernel import GemmInstance, KernelLoadError, LoadedKernel, cutlass_status_name, make_args
from ..measurement import SIDE_FIELDS, Baseline, Clocks, Measurement, TimingMethod
from ..space import BLOCKWISE_K, Problem, RuntimeArgs
from ..status import Status
from ._env import ClockMonitor, env_stamp
from ._job import Job
from ._race import coarse, contenders, entry, leader_of
from ._regimes import time_regime
from ._targets import (  # noqa: F401 - CublasTarget re-exported
    CublasTarget,
    baseline_note,
    baseline_target,
)
from ._targets import Target as _Target
from ._timing import L2Flush, TimingOptions, TimingStats, rotation_count, time_sides
from ._verify import Operands, allocate, randomize, reference, verify_launch

UNSTABLE_SPREAD = 0.5
"""Largest (p80 - p20) / median accepted for a kernel or its paired baseline. Undisturbed
measurements on the H200 stay under 0.2 (the committed paired stores: 4 of 4953 above 0.2);
two host-disturbed ones read 0.59-1.33, one of them a 1.49 "ratio" at 128^3."""


def _spread(stats: TimingStats | None) -> float:
    return 0.0 if stats is None else stats.spread


def unstable_reason(spread: float) -> str:
    """The reason recorded with an UNSTABLE measurement."""
    return (f"timing spread (p80 - p20) / median {spread:.2f}, above {UNSTABLE_SPREAD}, twice: "
            "the host or GPU was disturbed")


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class CutlassTarget(_Target):
    """A compiled kernel, initialized once per variant, then launched (S_run) alone.

    `scale_n` is the kernel's `KernelConfig.scale_n`: below 128 it reads the operands' block-wise
    B scales expanded to that granularity, a copy `setup` makes from the operands it is given
    (untimed) and keeps while the kernel may read it; D is still checked against the reference
    of the operands' own scales."""

    def __init__(self, kernel: LoadedKernel, device: int, sm_count: int, scale_n: int = BLOCKWISE_K):
        self._kernel, self._device, self._sm_count, self._scale_n = kernel, device, sm_count, scale_n
        self._gemm: GemmInstance = kernel.create()
        self._workspace: torch.Tensor | None = None
        self._scale_b: torch.Tensor | None = None

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        """can_implement, workspace, initialize. Returns why the kernel cannot run the
        problem, or None. Raises KernelStatusError when initialize fails."""
        pointers = {name: t.data_ptr() for name, t in ops.inputs.items() if name not in ("a", "b")}
        if ops.scale_b is not None and self._scale_n != BLOCKWISE_K:
            self._scale_b = expand_blockwise_scale_b(ops.scale_b, ops.problem.n, self._scale_n)
            pointers["scale_b"] = self._scale_b.data_ptr()
        args = make_args(ops.problem, variant, a=ops.a.data_ptr(), b=ops.b.data_ptr(),
                         d=ops.d.data_ptr(), device_id=self._device, sm_count=self._sm_count, **pointers)
        code = self._kernel.can_implement(args)
        if code != 0:
            return f"can_implement returned {cutlass_status_name(code)}"
        size = self._kernel.workspace_size(args)
        workspace = torch.empty(size, dtype=torch.uint8, device=ops.d.device) if size else None
        self._workspace = workspace
        self._gemm.initialize(args, workspace.data_ptr() if workspace is not None else None, _stream())
        # Stream-K barrier counters grow with each launch and must start at zero. A grouped
        # kernel's workspace holds its per-group arrays, which `run` rebuilds from the offsets
        # (the ABI's contract): zeroing them would only add a memset to its time.
        self.rearm = workspace.zero_ if workspace is not None and not ops.problem.grouped else None
        return None

    def launch(self) -> None:
        self._gemm.run(_stream())

    def sibling(self) -> CutlassTarget:
        return CutlassTarget(self._kernel, self._device, self._sm_count, self._scale_n)

    def close(self) -> None:
        self._gemm.close()
        self._workspace = None
        self._scale_b = None


class GpuRunner:
    """Runs jobs on CUDA device `device` of this process. Construct it in the worker.

    Keeps loaded libraries, the L2 flush buffer and the operands of the last problem.
    """

    def __init__(self, device: int):
        torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("highest")
        self.device = device
        self.env = env_stamp(device)
        self._flush = L2Flush(device, self.env.l2_bytes)
        self._clocks = ClockMonitor(device)
        self._kernels: dict[tuple[str, str], LoadedKernel] = {}
        self._ops: Operands | None = None
        self.side_note = ""
        """Why a side of the last baseline job (torch.compile, the expert loop, the dense GEMM)
        was not timed, or "" (`_sides`)."""

    def __call__(self, job: Job) -> Iterator[Measurement]:
        try:
            target = self._target(job)
        except KernelLoadError as err:
            for variant in job.variants:
                yield job.measurement(variant, Status.COMPILE_ERROR, str(err), self.env)
            return
        generator = torch.Generator(device=f"cuda:{self.device}")
        generator.manual_seed(job.seed)
        try:
            if job.races:
                yield from self._race(job, target, generator)
            else:
                for variant in job.variants:
                    yield self._measure(job, target, variant, generator)
        finally:
            target.close()

    def _race(self, job: Job, target: _Target, generator: torch.Generator) -> Iterator[Measurement]:
        """Every variant timed briefly, then the contenders at the full budget (bench/_race.py).
        The variants share one set of random operands and its reference: each is still verified
        (before and after its timing), and drawing new inputs would cost an fp32 GEMM apiece."""
        assert job.race is not None, "raced without race options"
        inputs = self._inputs(job, generator)
        brief = [self._measure(job, target, v, generator, timing=job.race.brief(job.timing), inputs=inputs)
                 for v in job.variants]
        paired = job.timing.paired
        entries = [entry(m, paired) for m in brief]
        keep = set(contenders(entries, job.bar, job.race))
        leader = leader_of(entries, job.bar)
        for i, m in enumerate(brief):
            if i in keep:
                continue
            yield coarse(m, leader, paired) if entries[i].score is not None and leader is not None else m
        for i, variant in enumerate(job.variants):
            if i in keep:
                yield self._measure(job, target, variant, generator, inputs=inputs)

    def _target(self, job: Job) -> _Target:
        if job.library is None:  # the baseline
            return baseline_target(job.problem, Baseline.of(job.problem))
        key = (str(job.library), job.symbol)
        if key not in self._kernels:
            self._kernels[key] = LoadedKernel(job.library, job.symbol)
        scale_n = job.config.scale_n if job.config is not None else BLOCKWISE_K
        return CutlassTarget(self._kernels[key], self.device, self.env.sm_count, scale_n)

    def _operands(self, problem: Problem) -> Operands:
        if self._ops is None or self._ops.problem != problem:
            self._ops = None  # free the previous problem's buffers first
            self._ops = allocate(problem, f"cuda:{self.device}")
        return self._ops

    def _inputs(self, job: Job, generator: torch.Generator) -> tuple[Operands, torch.Tensor]:
        """The problem's operands, freshly randomized, and their fp32 reference."""
        ops = self._operands(job.problem)
        randomize(ops, generator)
        return ops, reference(ops)

    def _measure(self, job: Job, target: _Target, variant: RuntimeArgs, generator: torch.Generator,
                 timing: TimingOptions | None = None,
                 inputs: tuple[Operands, torch.Tensor] | None = None) -> Measurement:
        """One variant: verified, timed by `timing` (default: the job's), verified again.
        `inputs`: operands and reference to reuse (default: fresh ones)."""
        def result(status: Status, reason: str = "", **fields) -> Measurement:
            return job.measurement(variant, status, reason, self.env, **fields)

        timing = timing or job.timing
        try:
            ops, ref = inputs or self._inputs(job, generator)
            why = target.setup(variant, ops)
            if why:
                return result(Status.CANNOT_IMPLEMENT, why)
            first = verify_launch(target.once, ops, ref)
            if first.status is not Status.OK:
                return result(first.status, first.reason, rel_error=first.rel_error, worst_error=first.worst_error)
            sides = self._sides(job, ops, ref)
            before = self._clocks.read()
            for _attempt in range(2):
                if timing.method is TimingMethod.SUSTAINED:
                    stats, *found = self._time_sustained(job, variant, target, sides, ops)
                else:
                    stats, *found = time_sides([target.launch] + [s.launch for _, s in sides], options=timing,
                                               flush=self._flush, prepare=target.rearm)
                spread = max(_spread(t) for t in (stats, *found))
                if spread <= UNSTABLE_SPREAD:
                    break
            after = self._clocks.read()
            for _, side in sides:
                side.close()
            again = verify_launch(target.once, ops, ref)
        except RuntimeError as err:  # torch's CUDA errors and KernelStatusError
            return result(Status.RUNTIME_ERROR, _first_line(err))
        if again.status is not Status.OK:
            return result(again.status, f"right after one launch, wrong after {stats.samples} "
                          f"more: {again.reason}", rel_error=again.rel_error,
                          worst_error=again.worst_error)
        clocks = Clocks.around(before, after)
        unstable = spread > UNSTABLE_SPREAD
        return result(
            Status.UNSTABLE if unstable else Status.OK,
            unstable_reason(spread) if unstable else self.side_note, rel_error=first.rel_error,
            worst_error=first.worst_error,
            median_ms=stats.median_ms, p20_ms=stats.p20_ms, p80_ms=stats.p80_ms, samples=stats.samples,
            tflops=job.problem.flops / (stats.median_ms * 1e9),
            throttled=clocks.throttled if clocks else False, clocks=clocks,
            energy_mj=stats.energy_mj, sm_mhz=stats.sm_mhz, power_w=stats.power_w,
            **{k: v for (prefix, _), st in zip(sides, found) for k, v in _side_figures(prefix, st).items()},
        )

    def _time_sustained(self, job: Job, variant: RuntimeArgs, target: _Target, named: list[tuple[str, _Target]],
                        ops: Operands) -> list[TimingStats]:
        """`time_sustained` of the target (and the sides timed with it, by their figures' prefix)
        over rotating copies of `ops`: each copy has its own kernel instance, initialized once on
        it. One `TimingStats` for the target, then one per side."""
        others = [side for _, side in named]
        names = [Baseline.of(job.problem).value if job.is_baseline else "kernel",
                 *(f"{prefix} side" for prefix, _ in named)]
        free, _total = torch.cuda.mem_get_info(self.device)
        count = rotation_count(ops.nbytes, self.env.l2_bytes, memory_bytes=free)
        copies = [ops] + [ops.copy() for _ in range(count - 1)]
        kernels: list[_Target] = [target]
        columns: list[list[_Target]] = [[other] for other in others]
        try:
            for c in copies[1:]:
                twin = target.sibling()
                kernels.append(twin)
                why = twin.setup(variant, c)
                if why:
                    raise RuntimeError(f"operand copy: {why}")
                for column in columns:
                    column.append(column[0].sibling())
                    column[-1].setup(RuntimeArgs(), c)
            sides = [[k.once for k in kernels]] + [[o.launch for o in column] for column in columns]
            return time_regime(sides, job.timing.regime, options=job.timing, probe=self._clocks.reading, names=names)
        finally:
            for k in kernels[1:]:
                k.close()
            for column in columns:
                for o in column[1:]:
                    o.close()

    def _sides(self, job: Job, ops: Operands, ref: torch.Tensor) -> list[tuple[str, _Target]]:
        """What is timed alternately with the job's target, set up on `ops`, each with the
        prefix of its figures' fields.

        A kernel job with paired timing: its problem's baseline (`Baseline.of`: cuBLAS, torch
        eager for a fused epilogue or fp8 scales, torch._grouped_mm for a grouped problem) when
        torch can run it ("baseline_*"). An fp8 kernel with fast accumulation is paired with
        torch._scaled_mm's fast accumulation: like with like. A baseline job: its baseline's
        sides (`Baseline.sides`: torch.compile and, where it `applies`, cuBLASLt's epilogue beside
        eager, the expert loop and the dense GEMM beside torch._grouped_mm), always, each verified
        first (`Target.check`); their figures become the row's `compile_*`, `lt_*`, `loop_*`,
        `dense_*`, and where one cannot run or is wrong,
        `side_note` says why.
        """
        self.side_note = ""
        if job.is_baseline:
            out, notes = [], []
            for kind in (k for k in Baseline.of(job.problem).sides if k.applies(job.problem)):
                side = baseline_target(job.problem, kind)
                why = side.setup(RuntimeArgs(), ops)
                if why is None:
                    verdict = side.check(ops, ref)
                    why = None if verdict.status is Status.OK else f"wrong result: {verdict.reason}"
                if why is None:
                    out.append((SIDE_FIELDS[kind], side))
                else:
                    side.close()
                    notes.append(f"{kind.value} not measured: {why}")
            if (note := baseline_note(job.problem, ops.d.device)) is not None:
                notes.insert(0, note)
            self.side_note = "; ".join(notes)[:500]
            return out
        if not job.timing.paired:
            return []
        fast = job.config is not None and job.config.fp8_fast_accum
        baseline = baseline_target(job.problem, Baseline.of(job.problem), fast_accum=fast)
        if baseline.setup(RuntimeArgs(), ops) is not None:
            return []
        return [("baseline", baseline)]


def _side_figures(prefix: str, stats: TimingStats) -> dict[str, float | None]:
    """A side's figures as `Measurement` fields: "baseline" (a kernel's paired baseline) with
    its energy and clock, the others (a baseline row's sides) their times only."""
    out: dict[str, float | None] = {f"{prefix}_median_ms": stats.median_ms, f"{prefix}_p20_ms": stats.p20_ms,
                                    f"{prefix}_p80_ms": stats.p80_ms}
    if prefix == "baseline":
        out.update(baseline_energy_mj=stats.energy_mj, baseline_sm_mhz=stats.sm_mhz,
                   baseline_power_w=stats.power_w)
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:500]
