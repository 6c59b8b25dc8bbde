"""A fake compiler and GPU for testing the search loop on a CPU, with recorded-looking figures."""

import dataclasses
import hashlib
import time
from pathlib import Path

from cutlass_tune.compile import CompiledKernel
from cutlass_tune.measurement import Measurement, TimingMethod, TimingScheme
from cutlass_tune.space import KernelSchedule, RuntimeArgs, SearchSpace, check_config, load_space
from cutlass_tune.status import Status


def space_of(tmp_path: Path, text: str) -> SearchSpace:
    """The search space a file holding `text` describes (written under `tmp_path`)."""
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return load_space(path)


def synthetic_tflops(cfg, problem, variant):
    """Deterministic figures with structure for the sampler: big tiles and 2x1 clusters win."""
    base = 300 + cfg.tile_m + cfg.tile_n + 40 * (cfg.cluster_m == 2)
    base += 30 * (cfg.kernel_schedule is KernelSchedule.COOPERATIVE)
    jitter = int(hashlib.sha256(f"{cfg.hash}{problem.name}{variant.name}".encode()).hexdigest()[:4], 16) % 20
    return float(base + jitter) * (problem.m / 4096) ** 0.1


class FakeCompiler:
    """Compiles nothing: every config OK, but those of tile N `fail_tile_n` (a compiler error)
    and of `transient_tile_n` (nvcc killed, as the OOM killer does: a transient failure)."""

    def __init__(self, fail_tile_n=None, transient_tile_n=None):
        self.calls = []
        self.fail_tile_n = fail_tile_n
        self.transient_tile_n = transient_tile_n

    def __call__(self, configs):
        self.calls.append(list(configs))
        out = []
        for c in configs:
            assert check_config(c) == [], f"an invalid config reached the compiler: {c.name}"
            transient = c.tile_n == self.transient_tile_n
            bad = c.tile_n == self.fail_tile_n or transient
            reason = "nvcc was killed by SIGKILL (out of memory?)" if transient else "error: planted" if bad else ""
            out.append(CompiledKernel(config=c, key=c.hash, status=Status.COMPILE_ERROR if bad else Status.OK,
                                      library=None if bad else Path("/fake.so"), symbol=f"ct_{c.hash}",
                                      seconds=30.0, cached=False, reason=reason, transient=transient))
        return out


class FakeBench:
    gpu_name = "Fake GPU"
    sm_count = 132
    scheme = TimingScheme(TimingMethod.EVENTS)

    def __init__(self, wrong_tile_m=None, interrupt_after=None):
        self.measured = []
        self.wrong_tile_m = wrong_tile_m
        self.interrupt_after = interrupt_after

    def baseline(self, problem):
        return Measurement(problem=problem, config=None, runtime=RuntimeArgs(), status=Status.OK,
                           is_baseline=True, tflops=600.0, median_ms=1.0, p20_ms=0.9, p80_ms=1.1, samples=10)

    def measure(self, kernel, problem, variants, bar=None):
        for v in variants:
            if self.interrupt_after is not None and len(self.measured) >= self.interrupt_after:
                raise KeyboardInterrupt
            self.measured.append((kernel.config.hash, problem.name, v.name))
            if kernel.config.tile_m == self.wrong_tile_m:
                yield Measurement(problem=problem, config=kernel.config, runtime=v,
                                  status=Status.WRONG_RESULT, reason="rel error 0.9 > 0.01")
                continue
            t = synthetic_tflops(kernel.config, problem, v)
            yield Measurement(problem=problem, config=kernel.config, runtime=v, status=Status.OK,
                              tflops=t, median_ms=problem.flops / t / 1e9, p20_ms=0.0, p80_ms=0.0, samples=10)


class SlowBench(FakeBench):
    """A fake GPU whose cuBLAS runs at `cublas` TFLOP/s and whose kernels take `delay` s each."""

    def __init__(self, cublas=600.0, delay=0.002, name="Fake GPU", **kw):
        super().__init__(**kw)
        self.cublas, self.delay, self.gpu_name = cublas, delay, name

    def baseline(self, problem):
        return dataclasses.replace(super().baseline(problem), tflops=self.cublas)

    def measure(self, kernel, problem, variants, bar=None):
        for m in super().measure(kernel, problem, variants):
            time.sleep(self.delay)
            yield m


def record(store, space, cfg, problems=None, variants=None, bench=None, run_id="earlier-run"):
    """Store `bench`'s measurements of `cfg` (compiled) on `problems` (default: all of its
    kind in `space`), `variants` of each (default: every one), as a sweep would."""
    from cutlass_tune.search import config_of, params_of

    kernel = FakeCompiler()([cfg])[0]
    for p in problems if problems is not None else space.problems:
        if config_of(params_of(cfg), p).hash != cfg.hash:
            continue
        chosen = variants if variants is not None else space.runtime_variants(cfg)
        for m in (bench or FakeBench()).measure(kernel, p, list(chosen)):
            store.add(m, gpu=FakeBench.gpu_name, run_id=run_id, cublas_tflops=600.0)
