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

from collections.abc import Callable, Iterator

import torch

from ..measurement import Clocks, Measurement, TimingMethod
from ..runtime import GemmInstance, KernelLoadError, LoadedKernel, cutlass_status_name, make_args
from ..space import DType, Problem, RuntimeArgs
from ..status import Status
from ._env import ClockMonitor, env_stamp
from ._job import Job
from ._timing import L2Flush, TimingStats, rotation_count, time_paired, time_sustained
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


class _Target:
    """What `GpuRunner` measures: `setup` per variant, then `launch` (timed) after `rearm`."""

    rearm: Callable[[], object] | None = None

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        """Prepare `variant` on `ops`; why the target cannot run them, or None."""
        raise NotImplementedError

    def launch(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def sibling(self) -> _Target:
        """A new target of the same kernel, to set up on other operands."""
        raise NotImplementedError

    def once(self) -> None:
        """One launch that is safe to repeat (re-arms the workspace first)."""
        if self.rearm is not None:
            self.rearm()
        self.launch()


class CublasTarget(_Target):
    """torch.matmul into a preallocated D: cuBLAS with the problem's layouts, no copies.

    fp8 inputs go to torch._scaled_mm (cuBLASLt) with unit scales; it takes only the tn layout,
    which is the only fp8 layout a `Problem` allows. `fast_accum` picks its fast accumulation
    (`use_fast_accum`), the counterpart of CUTLASS's FP8FastAccum kernels; the default is its
    promoting accumulation.
    """

    def __init__(self, problem: Problem, fast_accum: bool = False):
        self._problem = problem
        self._fast_accum = fast_accum
        self._ops: Operands | None = None
        self._unit_scale: torch.Tensor | None = None  # set for fp8: _scaled_mm's scale_a/b

    def setup(self, variant: RuntimeArgs, ops: Operands) -> str | None:
        """Bind to `ops`; returns why cuBLAS cannot run the problem, or None."""
        p = self._problem
        if p.dtype_a.is_fp8 or p.dtype_b.is_fp8:
            if not hasattr(torch, "_scaled_mm"):
                return f"torch {torch.__version__} has no torch._scaled_mm for an fp8 baseline"
            if p.dtype_a is DType.E5M2 and p.dtype_b is DType.E5M2:
                return "torch._scaled_mm has no e5m2 x e5m2 GEMM"
            if p.n % 16:
                return f"torch._scaled_mm needs N a multiple of 16, not {p.n}"
            self._unit_scale = torch.ones((), dtype=torch.float32, device=ops.d.device)
        elif p.dtype_d not in (p.dtype_a, DType.F32):
            return f"torch.matmul has no {p.dtype_a.value} x {p.dtype_b.value} -> {p.dtype_d.value} GEMM"
        self._ops = ops
        return None

    def launch(self) -> None:
        ops = self._ops
        assert ops is not None, "launched before setup"
        if self._unit_scale is not None:
            torch._scaled_mm(ops.a_mk, ops.b_kn, scale_a=self._unit_scale, scale_b=self._unit_scale,
                             out_dtype=ops.d.dtype, use_fast_accum=self._fast_accum, out=ops.d)
        elif ops.d.dtype == ops.a.dtype:
            torch.matmul(ops.a_mk, ops.b_kn, out=ops.d)
        else:
            torch.mm(ops.a_mk, ops.b_kn, out_dtype=ops.d.dtype, out=ops.d)

    def close(self) -> None:
        self._ops = self._unit_scale = None

    def sibling(self) -> CublasTarget:
        return CublasTarget(self._problem, self._fast_accum)


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
                         d=ops.d.data_ptr(), device_id=self._device, sm_count=self._sm_count)
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
            for variant in job.variants:
                yield self._measure(job, target, variant, generator)
        finally:
            target.close()

    def _target(self, job: Job) -> _Target:
        if job.library is None:  # the baseline
            return CublasTarget(job.problem)
        key = (str(job.library), job.symbol)
        if key not in self._kernels:
            self._kernels[key] = LoadedKernel(job.library, job.symbol)
        return CutlassTarget(self._kernels[key], self.device, self.env.sm_count)

    def _operands(self, problem: Problem) -> Operands:
        if self._ops is None or self._ops.problem != problem:
            self._ops = None  # free the previous problem's buffers first
            self._ops = allocate(problem, f"cuda:{self.device}")
        return self._ops

    def _measure(self, job: Job, target: _Target, variant: RuntimeArgs,
                 generator: torch.Generator) -> Measurement:
        def result(status: Status, reason: str = "", **fields) -> Measurement:
            return job.measurement(variant, status, reason, self.env, **fields)

        try:
            ops = self._operands(job.problem)
            randomize(ops, generator)
            ref = reference(ops)
            why = target.setup(variant, ops)
            if why:
                return result(Status.CANNOT_IMPLEMENT, why)
            first = verify_launch(target.once, ops, ref)
            if first.status is not Status.OK:
                return result(first.status, first.reason, rel_error=first.rel_error, worst_error=first.worst_error)
            baseline = self._paired_baseline(job, ops)
            before = self._clocks.read()
            for _attempt in range(2):
                if job.timing.method is TimingMethod.SUSTAINED:
                    stats, base = self._time_sustained(job, variant, target, baseline, ops)
                else:
                    stats, base = time_paired(target.launch, baseline.launch if baseline else None,
                                              options=job.timing, flush=self._flush, prepare=target.rearm)
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
            unstable_reason(spread) if unstable else "", rel_error=first.rel_error, worst_error=first.worst_error,
            median_ms=stats.median_ms, p20_ms=stats.p20_ms, p80_ms=stats.p80_ms, samples=stats.samples,
            tflops=job.problem.flops / (stats.median_ms * 1e9),
            throttled=clocks.throttled if clocks else False, clocks=clocks,
            energy_mj=stats.energy_mj, sm_mhz=stats.sm_mhz,
            **({} if base is None else dict(baseline_median_ms=base.median_ms, baseline_p20_ms=base.p20_ms,
                                            baseline_p80_ms=base.p80_ms, baseline_energy_mj=base.energy_mj,
                                            baseline_sm_mhz=base.sm_mhz)),
        )

    def _time_sustained(self, job: Job, variant: RuntimeArgs, target: _Target, baseline: CublasTarget | None,
                        ops: Operands) -> tuple[TimingStats, TimingStats | None]:
        """`time_sustained` of the target (and its paired baseline) over rotating copies of
        `ops`: each copy has its own kernel instance, initialized once on it."""
        free, _total = torch.cuda.mem_get_info(self.device)
        count = rotation_count(ops.nbytes, self.env.l2_bytes, memory_bytes=free)
        copies = [ops] + [ops.copy() for _ in range(count - 1)]
        kernels: list[_Target] = [target]
        baselines: list[CublasTarget] = [] if baseline is None else [baseline]
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

    def _paired_baseline(self, job: Job, ops: Operands) -> CublasTarget | None:
        """cuBLAS on the job's operands, to time alternately with the kernel, when the job
        asks for paired timing and cuBLAS can run the problem. An fp8 kernel with fast
        accumulation is paired with torch._scaled_mm's fast accumulation: like with like."""
        if not job.timing.paired or job.is_baseline:
            return None
        fast = job.config is not None and job.config.fp8_fast_accum
        baseline = CublasTarget(job.problem, fast_accum=fast)
        if baseline.setup(RuntimeArgs(), ops) is not None:
            return None
        return baseline


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:500]
