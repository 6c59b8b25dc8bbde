"""`Job`: what the parent sends a benchmark worker, one kernel (or cuBLAS) on one problem."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..compile import CompiledKernel
from ..errors import CutlassTuneError
from ..measurement import Baseline, EnvStamp, Measurement, TimingMethod
from ..space import KernelConfig, Problem, RuntimeArgs, check_pair, check_problem, check_runtime
from ..status import Status
from ._race import RaceOptions
from ._timing import TimingOptions


class InvalidJobError(CutlassTuneError):
    """A problem no kernel can run, or a kernel, problem and run-time variant that do not fit."""


@dataclasses.dataclass(frozen=True)
class Job:
    """Measure one compiled kernel, or the cuBLAS baseline (`library` None), on one problem
    for each of `variants`. Each variant gives one `Measurement`.

    Construct through `for_kernel` and `baseline`. Picklable: it crosses to the worker process.

    Raises:
        InvalidJobError: from the constructor, when the problem breaks a rule of
            `space.check_problem` (e.g. TMA alignment), or the config does not match it.
    """

    problem: Problem
    variants: tuple[RuntimeArgs, ...]
    library: Path | None = None
    symbol: str = ""
    config: KernelConfig | None = None
    compile_seconds: float | None = None
    timing: TimingOptions = TimingOptions()
    seed: int = 0
    repeat: int = 0
    race: RaceOptions | None = None
    """Race the variants (bench/_race.py): all briefly, the full `timing` only for those that can
    still be the problem's best. Ignored for the baseline, a single variant with no `bar`, and
    a method that does not race (`MethodFacts.races`: sustained timing)."""
    bar: float | None = None
    """The problem's best full score so far (paired ratio when `timing` is paired, else TFLOP/s):
    variants far below it are left coarse."""

    @property
    def races(self) -> bool:
        """Whether this job's variants are raced."""
        return (self.race is not None and not self.is_baseline
                and self.timing.method.facts.races
                and (len(self.variants) > 1 or self.bar is not None))

    def __post_init__(self) -> None:
        why = check_problem(self.problem)
        if self.config is not None:
            why += check_pair(self.config, self.problem)
            for v in self.variants:
                why += check_runtime(self.config, v)
        if why:
            raise InvalidJobError(f"{self.problem.name} with {self.kernel_name}: {why[0]}")
        if not self.variants:
            raise InvalidJobError(f"{self.kernel_name}: no run-time variant to measure")
        if self.is_baseline and self.variants != (RuntimeArgs(),):
            raise InvalidJobError("the cuBLAS baseline has no run-time variants")

    @property
    def is_baseline(self) -> bool:
        return self.library is None

    @property
    def regime(self) -> str:
        """The regime's name its measurements carry: "" for a method that times no regime
        (single launches, graph replays)."""
        return self.timing.regime.name if self.timing.method is TimingMethod.SUSTAINED else ""

    @property
    def kernel_name(self) -> str:
        if self.config is not None:
            return self.config.name
        return self.symbol or "cuBLAS"

    @classmethod
    def for_kernel(cls, kernel: CompiledKernel, problem: Problem, variants: tuple[RuntimeArgs, ...],
                   **kw: Any) -> Job:
        """Job for a successfully compiled kernel; `kw` sets timing, seed, repeat."""
        if kernel.status is not Status.OK or kernel.library is None:
            raise InvalidJobError(f"{kernel.config.name} did not compile: {kernel.reason}")
        return cls(problem=problem, variants=tuple(variants), library=kernel.library,
                   symbol=kernel.symbol, config=kernel.config, compile_seconds=kernel.seconds, **kw)

    @classmethod
    def baseline(cls, problem: Problem, **kw: Any) -> Job:
        """Job timing the problem's baseline (`Baseline.of`): torch.matmul (cuBLAS) for a plain
        problem; for a fused epilogue or fp8 scales, torch eager, with torch.compile of the same
        function timed in its sampling loop. `kw` sets timing, seed, repeat."""
        kind = Baseline.of(problem)
        return cls(problem=problem, variants=(RuntimeArgs(),),
                   symbol="" if kind is Baseline.CUBLAS else kind.value, **kw)

    def measurement(self, variant: RuntimeArgs, status: Status, reason: str = "",
                    env: EnvStamp | None = None, **fields: Any) -> Measurement:
        """A Measurement of this job's `variant`; `fields` sets timing, error, clocks.

        A baseline job's paired side is torch.compile (`GpuRunner._paired_baseline`): its
        `baseline_*` figures become the `compile_*` ones (its energy and clock are not kept).
        """
        if self.is_baseline:
            side = {name: fields.pop(f"baseline_{name}", None) for name in _SIDE_FIGURES}
            for name in ("median_ms", "p20_ms", "p80_ms"):
                if side[name] is not None:
                    fields[f"compile_{name}"] = side[name]
        return Measurement(
            problem=self.problem, config=self.config, runtime=variant, status=status,
            reason=reason, symbol=self.symbol, is_baseline=self.is_baseline,
            method=self.timing.method.value, env=env, compile_seconds=self.compile_seconds,
            repeat=self.repeat, regime=self.regime, **fields,
        )


_SIDE_FIGURES = ("median_ms", "p20_ms", "p80_ms", "energy_mj", "sm_mhz", "power_w")
