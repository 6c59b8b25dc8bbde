"""Confirmation of a sweep's winners: which candidates, how they are re-measured, and how the
best-config table ranks them afterwards (CPU only: a scripted GPU)."""

import dataclasses

import pytest

from cutlass_tune import load_best
from cutlass_tune.measurement import Measurement, TimingMethod, TimingScheme
from cutlass_tune.search import CONFIRM_STUDY, candidates, confirm
from cutlass_tune.space import (
    Activation,
    Epilogue,
    EpilogueSchedule,
    KernelConfig,
    KernelSchedule,
    Problem,
    RasterOrder,
    RuntimeArgs,
    check_config,
)
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore

from .fakes import FakeCompiler

BIG, SMALL = Problem(4096, 4096, 4096), Problem(1024, 1024, 1024)
PINGPONG = KernelConfig(tile_m=128, tile_n=128, kernel_schedule=KernelSchedule.PINGPONG,
                        epilogue_schedule=EpilogueSchedule.TMA)
COOP = KernelConfig(tile_m=128, tile_n=256, kernel_schedule=KernelSchedule.COOPERATIVE)
PLAIN = KernelConfig(tile_m=64, tile_n=128, kernel_schedule=KernelSchedule.TMA_WS,
                     epilogue_schedule=EpilogueSchedule.TMA)
assert not any(check_config(c) for c in (PINGPONG, COOP, PLAIN))
ALONG_N = RuntimeArgs(raster=RasterOrder.ALONG_N)
SWIZZLE_2 = RuntimeArgs(swizzle=2)
CUBLAS_TFLOPS = 600.0


def kernel(problem, cfg, runtime, ratio, status=Status.OK):
    t = CUBLAS_TFLOPS * ratio
    return Measurement(problem=problem, config=cfg, runtime=runtime, status=status,
                       tflops=t if status is Status.OK else None,
                       median_ms=problem.flops / t / 1e9 if status is Status.OK else None,
                       p20_ms=0.0, p80_ms=0.0, samples=10,
                       reason="" if status is Status.OK else "rel error 0.9 > 0.01")


def baseline(problem):
    return Measurement(problem=problem, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                       tflops=CUBLAS_TFLOPS, median_ms=problem.flops / CUBLAS_TFLOPS / 1e9, samples=10)


class ScriptedBench:
    """A GPU whose kernels run at a given ratio to cuBLAS, per (config, run-time name)."""

    gpu_name = "Fake GPU"
    sm_count = 132
    scheme = TimingScheme(TimingMethod.EVENTS)

    def __init__(self, ratios, wrong=()):
        self.ratios, self.wrong, self.order = ratios, set(wrong), []

    def baseline(self, problem):
        self.order.append(("cuBLAS", problem.name))
        return baseline(problem)

    def measure(self, compiled, problem, variants, bar=None):
        for v in variants:
            self.order.append((compiled.config.name, problem.name, v.name))
            key = (compiled.config.hash, v.name)
            status = Status.WRONG_RESULT if key in self.wrong else Status.OK
            yield kernel(problem, compiled.config, v, self.ratios.get(key, 0.5), status)


@pytest.fixture
def store(tmp_path):
    """A swept store: on BIG, PINGPONG (heuristic raster) read a lucky 1.05, with swizzle 2
    1.045; COOP 1.03 and 1.01; PLAIN 0.90, along N 1.06, and once a wrong result; on SMALL,
    PLAIN 1.01."""
    s = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    s.bind_gpu("Fake GPU")
    rows = [(BIG, PINGPONG, RuntimeArgs(), 1.05, Status.OK), (BIG, COOP, RuntimeArgs(), 1.03, Status.OK),
            (BIG, COOP, RuntimeArgs(), 1.01, Status.OK), (BIG, PLAIN, RuntimeArgs(), 0.90, Status.OK),
            (BIG, PINGPONG, SWIZZLE_2, 1.045, Status.OK), (BIG, PLAIN, ALONG_N, 1.06, Status.OK),
            (BIG, PLAIN, RuntimeArgs(), 0.0, Status.WRONG_RESULT),
            (SMALL, PLAIN, RuntimeArgs(), 1.01, Status.OK)]
    for problem, cfg, runtime, ratio, status in rows:
        s.add(baseline(problem), gpu="Fake GPU", run_id="sweep", study=f"study-{problem.name}")
        s.add(kernel(problem, cfg, runtime, ratio or 1.0, status), gpu="Fake GPU", run_id="sweep",
              cublas_tflops=CUBLAS_TFLOPS, study=f"study-{problem.name}")
    return s


def test_candidates_are_each_problems_best_variants_never_a_wrong_one(store):
    chosen = candidates(store, top=2)
    assert [(c.problem, c.config.name, c.runtime.name, round(c.ratio, 3)) for c in chosen] == [
        (BIG, PINGPONG.name, RuntimeArgs().name, 1.05),
        (BIG, COOP.name, RuntimeArgs().name, 1.03),  # its best sweep figure, not its last
        (SMALL, PLAIN.name, RuntimeArgs().name, 1.01),
    ]  # one variant per kernel (not PINGPONG with swizzle 2 before COOP); PLAIN was once wrong on BIG
    assert [c.runtime for c in candidates(store, top=3) if c.config == PINGPONG] == [RuntimeArgs()]


def test_confirm_measures_each_candidate_every_pass_with_a_fresh_baseline(store):
    chosen = candidates(store, top=2)
    bench = ScriptedBench({(PINGPONG.hash, RuntimeArgs().name): 1.00, (COOP.hash, RuntimeArgs().name): 1.02,
                           (PLAIN.hash, RuntimeArgs().name): 1.01})
    compiler = FakeCompiler()
    result = confirm(store, chosen, compiler, bench, passes=3)
    assert len(compiler.calls) == 1 and {c.hash for c in compiler.calls[0]} == {PINGPONG.hash, COOP.hash, PLAIN.hash}
    big = [(name, p) for name, p, *_ in bench.order if p == BIG.name]
    # per pass: cuBLAS, then the candidates, in ranking order on even passes, reversed on odd ones
    assert big == [("cuBLAS", BIG.name), (PINGPONG.name, BIG.name), (COOP.name, BIG.name),
                   ("cuBLAS", BIG.name), (COOP.name, BIG.name), (PINGPONG.name, BIG.name),
                   ("cuBLAS", BIG.name), (PINGPONG.name, BIG.name), (COOP.name, BIG.name)]
    rows = [r for r in store.rows() if r.study == CONFIRM_STUDY]
    assert len(rows) == 3 * (2 + 3) and {r.run_id for r in rows} == {result.run_id}
    assert result.ratios()[(BIG.name, COOP.name, RuntimeArgs().name)] == pytest.approx([1.02] * 3)
    passes = sorted(m.repeat for m, _ in result.rows if m.problem == SMALL and not m.is_baseline)
    assert passes == [0, 1, 2]


def test_after_confirmation_the_best_is_the_best_median_not_the_luckiest_sweep_figure(store):
    before = load_best(store.url).set_index("problem")
    assert before.loc[BIG.name, "kernel"] == PINGPONG.name and before.loc[BIG.name, "confirm_passes"] == 0
    script = iter([1.00, 1.02, 1.03, 0.99, 1.01, 1.01])  # BIG's kernels in measuring order

    class Drifting(ScriptedBench):
        def measure(self, compiled, problem, variants, bar=None):
            for m in super().measure(compiled, problem, variants):
                yield kernel(problem, m.config, m.runtime, next(script)) if problem == BIG else m

    confirm(store, candidates(store, top=2), FakeCompiler(),
            Drifting({(PLAIN.hash, RuntimeArgs().name): 1.01}), passes=3)
    after = load_best(store.url).set_index("problem")
    big = after.loc[BIG.name]
    # PINGPONG (swept 1.05) re-measured 1.00, 0.99, 1.01; COOP (swept 1.03) 1.02, 1.03, 1.01
    assert big["kernel"] == COOP.name
    assert big["ratio"] == pytest.approx(1.02) and big["sweep_ratio"] == pytest.approx(1.03)
    assert (big["confirm_passes"], big["ratio_low"], big["ratio_high"]) == (3, pytest.approx(1.01), pytest.approx(1.03))
    assert big["tflops"] == pytest.approx(CUBLAS_TFLOPS * 1.02)  # the median pass's own figures
    small = after.loc[SMALL.name]
    assert small["kernel"] == PLAIN.name and small["confirm_passes"] == 3


def test_the_confirmed_median_of_an_even_count_is_the_one_the_table_ranks_by(store):
    script = iter([1.00, 1.02, 1.04, 1.00])  # BIG's kernels in measuring order, two passes

    class Drifting(ScriptedBench):
        def measure(self, compiled, problem, variants, bar=None):
            for m in super().measure(compiled, problem, variants):
                yield kernel(problem, m.config, m.runtime, next(script)) if problem == BIG else m

    result = confirm(store, candidates(store, top=2), FakeCompiler(),
                     Drifting({(PLAIN.hash, RuntimeArgs().name): 1.01}), passes=2)
    medians = result.medians()
    # PINGPONG passes 1.00 and 1.00, COOP 1.02 and 1.04: its median is their mean, not the lower
    assert medians[(BIG.name, COOP.name, RuntimeArgs().name)] == pytest.approx(1.03)
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert big["kernel"] == COOP.name and big["ratio"] == pytest.approx(1.03)


def test_a_candidate_wrong_in_confirmation_is_never_best_again(store):
    bench = ScriptedBench({(PINGPONG.hash, RuntimeArgs().name): 1.10, (COOP.hash, RuntimeArgs().name): 0.98,
                           (PLAIN.hash, RuntimeArgs().name): 1.01}, wrong={(PINGPONG.hash, RuntimeArgs().name)})
    result = confirm(store, candidates(store, top=2), FakeCompiler(), bench, passes=2)
    assert sum(m.status is Status.WRONG_RESULT for m, _ in result.rows) == 2
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert big["kernel"] == COOP.name and big["ratio"] == pytest.approx(0.98)
    assert big["confirm_passes"] == 2
    assert [c.config.name for c in candidates(store, top=3) if c.problem == BIG] == [COOP.name]


def test_a_kernel_that_no_longer_compiles_is_recorded_once_and_the_rest_confirmed(store):
    bench = ScriptedBench({(PINGPONG.hash, RuntimeArgs().name): 1.0, (PLAIN.hash, RuntimeArgs().name): 1.0})
    result = confirm(store, candidates(store, top=2), FakeCompiler(fail_tile_n=256), bench, passes=2)
    failed = [m for m, _ in result.rows if m.status is Status.COMPILE_ERROR]
    assert [(m.problem, m.config.name) for m in failed] == [(BIG, COOP.name)]
    assert "planted" in failed[0].reason
    assert COOP.name not in {name for name, *_ in bench.order}


def _cli(*args):
    import shutil
    import subprocess
    import sys

    exe = shutil.which("cutlass-tune")
    cmd = [exe] if exe else [sys.executable, "-m", "cutlass_tune.cli"]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True)


@pytest.mark.parametrize("storage, message", [
    ("{tmp}/missing.sqlite", "error: no store at sqlite:///{tmp}/missing.sqlite\n"),
    ("{tmp}/table.csv", "error: --storage {tmp}/table.csv: expected a store URL or a .sqlite file\n"),
    ("{tmp}/empty.sqlite",
     "error: store sqlite:///{tmp}/empty.sqlite has no successful kernel measurement to confirm\n"),
])
def test_confirm_rejects_what_it_cannot_confirm_in_one_line(tmp_path, storage, message):
    ResultStore(f"sqlite:///{tmp_path / 'empty.sqlite'}").bind_gpu("NVIDIA H200")  # creates the tables, adds nothing
    r = _cli("confirm", "--storage", storage.format(tmp=tmp_path))
    assert (r.returncode, r.stderr, r.stdout) == (2, message.format(tmp=tmp_path), "")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message shown without a GPU")
def test_confirm_without_a_gpu_is_one_line_and_leaves_the_store_alone(store):
    before = len(store.rows())
    r = _cli("confirm", "--storage", store.url, "--passes", "2")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "error: no CUDA GPU is visible; `cutlass-tune compile CONFIG` builds kernels without one\n"
    assert len(store.rows()) == before


def test_confirm_refuses_a_store_of_another_gpu_before_measuring(store):
    from cutlass_tune.store import StoreGpuMismatchError

    bench = ScriptedBench({})
    bench.gpu_name = "Other GPU"
    before = len(store.rows())
    with pytest.raises(StoreGpuMismatchError, match="Fake GPU"):
        confirm(store, candidates(store, top=1), FakeCompiler(), bench, passes=1)
    assert bench.order == [] and len(store.rows()) == before


def test_confirm_prints_the_median_the_table_ranks_by(store, monkeypatch):
    """The command's own table, on a scripted GPU: two passes, COOP at 1.02 and 1.04."""
    from typer.testing import CliRunner

    import cutlass_tune.bench
    import cutlass_tune.compile
    from cutlass_tune.cli import app

    script = iter([1.00, 1.02, 1.04, 1.00])

    class Gpu(ScriptedBench):
        def __init__(self, gpu):
            super().__init__({(PLAIN.hash, RuntimeArgs().name): 1.01})
            self.timing = cutlass_tune.bench.TimingOptions()

        @property
        def scheme(self):  # as the worker names it: the store's own pairing is kept
            return self.timing.scheme


        def measure(self, compiled, problem, variants, bar=None):
            for m in super().measure(compiled, problem, variants):
                yield kernel(problem, m.config, m.runtime, next(script)) if problem == BIG else m

        def close(self):
            pass

    monkeypatch.setattr(cutlass_tune.bench, "WorkerBenchmarker", Gpu)
    monkeypatch.setattr(cutlass_tune.compile, "compile_kernels", lambda cfgs, **kw: FakeCompiler()(cfgs))
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", "/nonexistent/nvcc")  # the patch, not nvcc, compiles
    r = CliRunner().invoke(app, ["confirm", "--storage", store.url, "--passes", "2"], terminal_width=250)
    assert r.exit_code == 0, r.output
    coop = next(line.split() for line in r.output.splitlines() if line.startswith(BIG.name) and COOP.name in line)
    # sweep, confirmed median, passes, low-high, to the strongest (cuBLAS for a plain problem), clock and power
    assert coop[-7:] == ["1.030", "1.030", "2", "1.020-1.040", "1.030", "-", "-"]


def test_a_problem_confirmed_sustained_ranks_by_those_passes_beside_the_sweeps_method(store):
    # Single launches (the sweep's method) favour PINGPONG; the steady stream a model runs favours COOP.
    events = ScriptedBench({(PINGPONG.hash, RuntimeArgs().name): 1.04, (COOP.hash, RuntimeArgs().name): 1.02})
    confirm(store, candidates(store, top=2), FakeCompiler(), events, passes=3)
    assert load_best(store.url).set_index("problem").loc[BIG.name, "kernel"] == PINGPONG.name

    class Sustained(ScriptedBench):
        def measure(self, compiled, problem, variants, bar=None):
            for m in super().measure(compiled, problem, variants):
                yield dataclasses.replace(m, method="sustained", energy_mj=5.0, baseline_energy_mj=6.0)

    sustained = Sustained({(PINGPONG.hash, RuntimeArgs().name): 0.96, (COOP.hash, RuntimeArgs().name): 0.99})
    confirm(store, candidates(store, top=2), FakeCompiler(), sustained, passes=3)
    assert store.timing() == TimingScheme(TimingMethod.EVENTS)  # the sweep's method stays the store's
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert (big["kernel"], big["method"], big["confirm_passes"]) == (COOP.name, "sustained", 3)
    assert big["ratio"] == pytest.approx(0.99) and big["sweep_ratio"] == pytest.approx(1.03)
    assert (big["energy_mj"], big["cublas_energy_mj"]) == (5.0, 6.0)


def test_a_grouped_problem_is_confirmed_with_its_experts_and_its_own_baseline(tmp_path):
    """Guards against rebuilding a grouped problem from m, n, k: its experts and routed rows
    would be lost, and its kernels measured on a problem of no experts."""
    from cutlass_tune.space import Routing

    experts = Problem.experts(128, 1536, 2048, 4096, routing=Routing.ZIPF)
    cfg = KernelConfig.for_operation(experts, tile_m=128, tile_n=192, kernel_schedule=KernelSchedule.PINGPONG,
                                     epilogue_schedule=EpilogueSchedule.TMA)
    s = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    s.bind_gpu("Fake GPU")
    s.add(baseline(experts), gpu="Fake GPU", run_id="sweep")
    s.add(kernel(experts, cfg, RuntimeArgs(), 1.2), gpu="Fake GPU", run_id="sweep", cublas_tflops=CUBLAS_TFLOPS)
    chosen = candidates(s, top=2)
    assert [c.problem for c in chosen] == [experts] and chosen[0].problem.group_rows == experts.group_rows
    bench = ScriptedBench({(cfg.hash, RuntimeArgs().name): 1.1})
    confirm(s, chosen, FakeCompiler(), bench, passes=2)
    assert [p for _, p, *_ in bench.order] == [experts.name] * 4  # the baseline of its own problem first
    best = load_best(s.url).set_index("problem")
    assert best.loc[experts.name, "confirm_passes"] == 2 and best.loc[experts.name, "routing"] == "zipf"


def test_confirm_carries_each_pass_s_ratio_to_the_strongest_torch_path(tmp_path):
    """A fused problem whose eager row timed cuBLASLt's epilogue 1.25x faster than eager in the
    first pass and as fast in the second: the kernel's ratio to eager over that pass's factor."""
    tanh = Problem(4096, 4096, 4096, epilogue=Epilogue(bias=True, activation=Activation.GELU_TANH))
    cfg = dataclasses.replace(PINGPONG, epilogue=tanh.epilogue)
    s = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    s.bind_gpu("Fake GPU")
    s.add(baseline(tanh), gpu="Fake GPU", run_id="sweep")
    s.add(kernel(tanh, cfg, RuntimeArgs(), 1.3), gpu="Fake GPU", run_id="sweep", cublas_tflops=CUBLAS_TFLOPS)
    factors = iter([1.25, 1.0])

    class Lt(ScriptedBench):
        def baseline(self, problem):
            eager = dataclasses.replace(baseline(problem), symbol="torch eager")
            return dataclasses.replace(eager, lt_median_ms=eager.median_ms / next(factors))

    result = confirm(s, candidates(s, top=1), FakeCompiler(), Lt({(cfg.hash, RuntimeArgs().name): 1.3}), passes=2)
    key = (tanh.name, cfg.name, RuntimeArgs().name)
    assert result.ratios()[key] == pytest.approx([1.3, 1.3])
    assert result.strongest_ratios()[key] == pytest.approx([1.3 / 1.25, 1.3])
    assert result.strongest_medians()[key] == pytest.approx((1.04 + 1.3) / 2)
    best = load_best(s.url).iloc[0]
    assert best["strongest_ratio"] == pytest.approx((1.04 + 1.3) / 2) and best["ratio"] == pytest.approx(1.3)


def test_confirm_measures_only_the_problems_its_patterns_name(store, monkeypatch):
    """`--problem PATTERN` (repeatable) keeps the candidates whose problem name matches; a pattern
    that matches none is a one-line error naming the store's problems, with nothing measured."""
    from typer.testing import CliRunner

    import cutlass_tune.bench
    import cutlass_tune.compile
    from cutlass_tune.cli import app

    measured = []

    class Gpu(ScriptedBench):
        def __init__(self, gpu):
            super().__init__({})
            self.timing = cutlass_tune.bench.TimingOptions()

        @property
        def scheme(self):
            return self.timing.scheme

        def measure(self, compiled, problem, variants, bar=None):
            measured.append(problem)
            yield from super().measure(compiled, problem, variants)

        def close(self):
            pass

    monkeypatch.setattr(cutlass_tune.bench, "WorkerBenchmarker", Gpu)
    monkeypatch.setattr(cutlass_tune.compile, "compile_kernels", lambda cfgs, **kw: FakeCompiler()(cfgs))
    monkeypatch.setenv("CUTLASS_TUNE_NVCC", "/nonexistent/nvcc")
    runner = CliRunner()
    r = runner.invoke(app, ["confirm", "--storage", store.url, "--passes", "1", "--problem", "1024x*"],
                      terminal_width=250)
    assert r.exit_code == 0, r.output
    assert set(measured) == {SMALL}
    before = len(store.rows())
    r = _cli("confirm", "--storage", store.url, "--problem", "16x*", "--problem", "*fp8*")
    assert (r.returncode, r.stdout, len(store.rows())) == (2, "", before)
    assert r.stderr.startswith(f"error: no problem of {store.url} matches --problem '16x*', '*fp8*' (its problems: ")
    assert BIG.name in r.stderr and len(r.stderr.splitlines()) == 1


class RegimeBench(ScriptedBench):
    """A scripted GPU timing by the sustained method in `regime`, at the given clock and power."""

    def __init__(self, ratios, regime, sm_mhz, power_w):
        super().__init__(ratios)
        self.regime, self.sm_mhz, self.power_w = regime, sm_mhz, power_w

    def measure(self, compiled, problem, variants, bar=None):
        for m in super().measure(compiled, problem, variants):
            yield dataclasses.replace(m, method="sustained", regime=self.regime, sm_mhz=self.sm_mhz,
                                      power_w=self.power_w)


def test_regime_passes_give_the_chosen_kernels_figures_never_its_choice(store):
    """Guards against rows of another regime ranking a problem: at the cap COOP wins; with idle gaps
    PINGPONG would, but the table keeps COOP and shows its idle-gap ratio, clock and power."""
    at_cap = {(PINGPONG.hash, RuntimeArgs().name): 0.96, (COOP.hash, RuntimeArgs().name): 0.99}
    confirm(store, candidates(store, top=2), FakeCompiler(), RegimeBench(at_cap, "sustained", 1440.0, 690.0), 3)
    gaps = {(PINGPONG.hash, RuntimeArgs().name): 1.10, (COOP.hash, RuntimeArgs().name): 0.97}
    confirm(store, candidates(store, top=2), FakeCompiler(), RegimeBench(gaps, "idle-gap:200us", 1980.0, 580.0), 3)
    assert {r.regime for r in store.rows()} == {"sustained", "idle-gap:200us"}
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert (big["kernel"], big["confirm_passes"]) == (COOP.name, 3)
    assert big["ratio"] == pytest.approx(0.99)
    assert (big["sustained_regime"], big["sustained_sm_mhz"], big["sustained_power_w"]) == ("sustained", 1440.0, 690.0)
    assert big["sustained_ratio"] == pytest.approx(0.99)
    assert (big["idle_gap_regime"], big["idle_gap_sm_mhz"], big["idle_gap_power_w"]) == ("idle-gap:200us", 1980.0,
                                                                                       580.0)
    assert big["idle_gap_ratio"] == pytest.approx(0.97)
    assert big["interleaved_regime"] == "" and big["interleaved_ratio"] != big["interleaved_ratio"]  # NaN
    small = load_best(store.url).set_index("problem").loc[SMALL.name]
    assert small["idle_gap_ratio"] == pytest.approx(0.5)  # PLAIN, the scripted default


def test_a_problem_confirmed_in_a_gap_regime_only_ranks_by_its_sweep(store):
    gaps = {(PINGPONG.hash, RuntimeArgs().name): 0.90, (COOP.hash, RuntimeArgs().name): 1.20}
    confirm(store, candidates(store, top=2), FakeCompiler(), RegimeBench(gaps, "idle-gap:200us", 1980.0, 580.0), 2)
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert (big["kernel"], big["confirm_passes"]) == (PINGPONG.name, 0)  # the sweep's lucky 1.05
    assert big["idle_gap_ratio"] == pytest.approx(0.90) and big["sustained_regime"] == ""


@pytest.mark.parametrize(("args", "message"), [
    (["--regime", "idle"], "unknown regime 'idle'"),
    (["--regime", "idle-gap:5ms"], "is not a number of us"),
    (["--regime", "idle-gap", "--method", "events"], "--regime idle-gap:200us is a setting of the sustained method"),
    (["--regime", "in-model:compiled:4096"], "regime in-model:compiled:4096: the bench cannot time a model's step; "
                                             "`cutlass-tune tune-model` measures"),
])
def test_confirm_refuses_a_bad_regime_in_one_line(store, args, message):
    done = _cli("confirm", "--storage", store.url, *args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_best_and_the_dashboard_show_each_regimes_ratio_clock_and_power(store):
    from cutlass_tune.report import build_dashboard

    at_cap = {(PINGPONG.hash, RuntimeArgs().name): 0.96, (COOP.hash, RuntimeArgs().name): 0.99}
    confirm(store, candidates(store, top=2), FakeCompiler(), RegimeBench(at_cap, "sustained", 1440.0, 690.0), 1)
    gaps = {(PINGPONG.hash, RuntimeArgs().name): 1.10, (COOP.hash, RuntimeArgs().name): 0.97}
    confirm(store, candidates(store, top=2), FakeCompiler(), RegimeBench(gaps, "idle-gap:200us", 1980.0, 580.0), 1)
    said = "sustained 0.990 at 1440 MHz 690 W; idle-gap:200us 0.970 at 1980 MHz 580 W"
    assert said in build_dashboard(store.url)
    from rich.console import Console

    from cutlass_tune.cli._best import _table

    console = Console(width=600, record=True)
    console.print(_table(load_best(store.url)))
    assert said in console.export_text()


def test_a_regimes_figures_reach_the_best_row_from_another_run_time_variant_of_its_kernel(store):
    """Guards against the regime columns staying empty where `best` picked another run-time variant
    of the kernel `confirm --regime` timed (the MoE store: ralong_m picked, rheuristic confirmed)."""
    by_sweep = candidates(store, top=2)  # PINGPONG's heuristic raster and COOP
    swizzled = [dataclasses.replace(c, runtime=SWIZZLE_2) if c.config == PINGPONG else c for c in by_sweep]
    at_cap = {(PINGPONG.hash, SWIZZLE_2.name): 1.00, (COOP.hash, RuntimeArgs().name): 0.99}
    confirm(store, swizzled, FakeCompiler(), RegimeBench(at_cap, "sustained", 1440.0, 690.0), 2)
    gaps = {(PINGPONG.hash, RuntimeArgs().name): 1.10, (COOP.hash, RuntimeArgs().name): 0.97}
    confirm(store, by_sweep, FakeCompiler(), RegimeBench(gaps, "idle-gap:200us", 1980.0, 580.0), 2)
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert (big["kernel"], big["runtime"], big["ratio"]) == (PINGPONG.name, SWIZZLE_2.name, pytest.approx(1.00))
    assert (big["idle_gap_regime"], big["idle_gap_sm_mhz"]) == ("idle-gap:200us", 1980.0)
    assert big["idle_gap_ratio"] == pytest.approx(1.10)  # the heuristic raster's, the kernel's only figure there
    # where the row's own variant was timed in the regime, its figures come first
    confirm(store, swizzled, FakeCompiler(), RegimeBench({(PINGPONG.hash, SWIZZLE_2.name): 1.07}, "idle-gap:200us",
                                                         1970.0, 575.0), 2)
    big = load_best(store.url).set_index("problem").loc[BIG.name]
    assert big["idle_gap_ratio"] == pytest.approx(1.07) and big["idle_gap_sm_mhz"] == 1970.0


def test_confirm_names_each_failure_with_its_reason():
    """Guards against a confirm run printing only a count of failures (`not ok: {'runtime_error': 2}`)
    while the reason sat in a store that did not come back from the GPU host."""
    from cutlass_tune.cli._confirm import failures

    said = "RuntimeError: timing in regime interleaved:64MiB: the host never got ahead of the GPU on side 1 of 3"
    torch_side = dataclasses.replace(baseline(BIG), status=Status.RUNTIME_ERROR, reason=said + "\nmore")
    wrong = kernel(BIG, COOP, ALONG_N, 1.0, Status.WRONG_RESULT)
    lines = failures([(torch_side, None), (baseline(SMALL), None), (torch_side, None), (wrong, None)])
    assert lines == [f"  runtime_error: {BIG.name} {torch_side.kernel_name} (torch's side) (2x): {said}",
                     f"  wrong_result: {BIG.name} {COOP.name} {ALONG_N.name} (1x): rel error 0.9 > 0.01"]
