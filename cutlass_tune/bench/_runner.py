"""Inside the worker process: run a `Job` on one GPU and yield a `Measurement` per variant.

For each variant: fresh random inputs, an fp32 reference, `can_implement`, workspace sized
by the kernel, `initialize` once, one launch into a NaN-poisoned output checked against the
reference, then the launches timed by `time_paired` (the same function for cuBLAS; with
paired timing the problem's cuBLAS call is sampled alternately with the kernel), then the
output checked again (a kernel can be right once and wrong when repeated).

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

from ..kernel import GemmInstance, KernelLoadError, LoadedKernel, cutlass_status_name, make_args
from ..measurement import Baseline, Clocks, Measurement, TimingMethod
from ..space import Problem, RuntimeArgs
from ..status import Status
from ._env import ClockMonitor, env_stamp
from ._job import Job
from ._race import coarse, contenders, entry, leader_of
from ._targets import CublasTarget, baseline_target  # noqa: F401 - CublasTarget re-exported
from ._targets import Target as _Target
from ._timing import L2Flush, TimingOptions, TimingStats, rotation_count, time_paired, time_sustained
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
    """A compiled kernel, initialized once per variant, then launched (S_run) alone."""

    def __init__(self, kernel: LoadedKernel, device: int, sm_count: int):
        self._kernel, self._device, self._sm_count = kernel, device, sm_count
        self._gemm: GemmInstance = kernel.create()
        self._workspace: torch.Tensor | None = None

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        """can_implement, workspace, initialize. Returns why the kernel cannot run the
        problem, or None. Raises KernelStatusError when initialize fails."""
        args = make_args(ops.problem, variant, a=ops.a.data_ptr(), b=ops.b.data_ptr(),
                         d=ops.d.data_ptr(), device_id=self._device, sm_count=self._sm_count,
                         **{name: t.data_ptr() for name, t in ops.inputs.items() if name not in ("a", "b")})
        code = self._kernel.can_implement(args)
        if code != 0:
            return f"can_implement returned {cutlass_status_name(code)}"
        size = self._kernel.workspace_size(args)
        workspace = torch.empty(size, dtype=torch.uint8, device=ops.d.device) if size else None
        self._workspace = workspace
        self._gemm.initialize(args, workspace.data_ptr() if workspace is not None else None, _stream())
        # Stream-K barrier counters grow with each launch and must start at zero.
        self.rearm = workspace.zero_ if workspace is not None else None
        return None

    def launch(self) -> None:
        self._gemm.run(_stream())

    def sibling(self) -> CutlassTarget:
        return CutlassTarget(self._kernel, self._device, self._sm_count)

    def close(self) -> None:
        self._gemm.close()
        self._workspace = None


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
        """Why the last job's second side (torch.compile) was not timed, or "" (`_paired_baseline`)."""

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
        return CutlassTarget(self._kernels[key], self.device, self.env.sm_count)

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
            baseline = self._paired_baseline(job, ops)
            before = self._clocks.read()
            for _attempt in range(2):
                if timing.method is TimingMethod.SUSTAINED:
                    stats, base = self._time_sustained(job, variant, target, baseline, ops)
                else:
                    stats, base = time_paired(target.launch, baseline.launch if baseline else None,
                                              options=timing, flush=self._flush, prepare=target.rearm)
                spread = max(_spread(stats), _spread(base))
                if spread <= UNSTABLE_SPREAD:
                    break
            after = self._clocks.read()
            if baseline is not None:
                baseline.close()
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
            energy_mj=stats.energy_mj, sm_mhz=stats.sm_mhz,
            **({} if base is None else dict(baseline_median_ms=base.median_ms, baseline_p20_ms=base.p20_ms,
                                            baseline_p80_ms=base.p80_ms, baseline_energy_mj=base.energy_mj,
                                            baseline_sm_mhz=base.sm_mhz)),
        )

    def _time_sustained(self, job: Job, variant: RuntimeArgs, target: _Target, baseline: _Target | None,
                        ops: Operands) -> tuple[TimingStats, TimingStats | None]:
        """`time_sustained` of the target (and its paired baseline) over rotating copies of
        `ops`: each copy has its own kernel instance, initialized once on it."""
        free, _total = torch.cuda.mem_get_info(self.device)
        count = rotation_count(ops.nbytes, self.env.l2_bytes, memory_bytes=free)
        copies = [ops] + [ops.copy() for _ in range(count - 1)]
        kernels: list[_Target] = [target]
        baselines: list[_Target] = [] if baseline is None else [baseline]
        try:
            for c in copies[1:]:
                other = target.sibling()
                kernels.append(other)
                why = other.setup(variant, c)
                if why:
                    raise RuntimeError(f"operand copy: {why}")
                if baseline is not None:
                    baselines.append(baseline.sibling())
                    baselines[-1].setup(RuntimeArgs(), c)
            sides = [[k.once for k in kernels]] + ([[b.launch for b in baselines]] if baselines else [])
            found = time_sustained(sides, options=job.timing, probe=self._clocks.reading)
        finally:
            for k in kernels[1:]:
                k.close()
            for b in baselines[1:]:
                b.close()
        return found[0], (found[1] if baseline is not None else None)

    def _paired_baseline(self, job: Job, ops: Operands) -> _Target | None:
        """What is timed alternately with the job's target, set up on `ops`, or None.

        A kernel job with paired timing: its problem's baseline (`Baseline.of`: cuBLAS, or
        torch eager for a fused epilogue or fp8 scales) when torch can run it. An fp8 kernel
        with fast accumulation is paired with torch._scaled_mm's fast accumulation: like with
        like. The eager baseline job of a fused problem: torch.compile of the same function,
        always, verified first; its figures become the row's `compile_*` (`Job.measurement`),
        and where it cannot run or is wrong, `side_note` says why.
        """
        self.side_note = ""
        if job.is_baseline:
            if Baseline.of(job.problem) is Baseline.CUBLAS:
                return None
            compiled = baseline_target(job.problem, Baseline.COMPILE)
            why = compiled.setup(RuntimeArgs(), ops)
            if why is None:
                verdict = verify_launch(compiled.once, ops, reference(ops))
                why = None if verdict.status is Status.OK else f"wrong result: {verdict.reason}"
            if why is not None:
                compiled.close()
                self.side_note = f"{Baseline.COMPILE.value} not measured: {why}"[:500]
                return None
            return compiled
        if not job.timing.paired:
            return None
        fast = job.config is not None and job.config.fp8_fast_accum
        baseline = baseline_target(job.problem, Baseline.of(job.problem), fast_accum=fast)
        if baseline.setup(RuntimeArgs(), ops) is not None:
            return None
        return baseline


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:500]
