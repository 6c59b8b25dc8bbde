import collections
import dataclasses

import optuna
import pytest

from cutlass_tune.errors import GpuUnusableError
from cutlass_tune.search import Studies, Sweep, SweepSettings
from cutlass_tune.space import check_config, load_space
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore, StoreGpuMismatchError

from .fakes import FakeBench, FakeCompiler, SlowBench, space_of

SPACE = """
problems: [{m: [1024, 4096], n: 4096, k: 4096}]
kernels:
  tile_m: [64, 128, 256]
  tile_n: [64, 128, 256]
  cluster: [1x1, 2x1, 1x2]
  kernel_schedule: [cooperative, pingpong]
  tile_scheduler: [persistent, stream_k]
runtime: {raster: [heuristic, along_n], swizzle: [1, 2]}
"""
SPACE_WITHOUT_C = SPACE.replace("  tile_scheduler: [persistent, stream_k]\n",
                                "  tile_scheduler: [persistent, stream_k]\n  epilogue_source: [true, false]\n")


@pytest.fixture
def space(tmp_path):
    return space_of(tmp_path, SPACE)


def make(space, tmp_path, bench=None, compiler=None, **settings):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    store = ResultStore(url)
    sweep = Sweep(space, store, url, compiler or FakeCompiler(), bench or FakeBench(),
                  SweepSettings(**{"trials": 6, "batch": 3, **settings}))
    return sweep, store


def kernel_rows(store):
    return [r for r in store.rows() if r.kernel != "cuBLAS"]


def test_sweep_compiles_within_budget_and_measures_every_problem(space, tmp_path):
    compiler, bench = FakeCompiler(), FakeBench()
    sweep, store = make(space, tmp_path, bench, compiler)
    state = sweep.run()
    compiled = [c for call in compiler.calls for c in call]
    assert len(compiled) == len({c.hash for c in compiled}) == 6  # each config compiled once
    assert state.stop_reason == "trial budget reached"
    # every compiled kernel measured on both problems, every run-time variant once
    counts = collections.Counter(bench.measured)
    assert set(counts.values()) == {1}
    assert len(bench.measured) == 6 * 2 * 4
    rows = kernel_rows(store)
    assert {r.problem for r in rows} == {p.name for p in space.problems}
    assert all(r.ratio == pytest.approx(r.tflops / 600.0) for r in rows)
    for pp in state.problems:
        best = max(r.tflops for r in rows if r.problem == pp.problem.name)
        assert pp.best_tflops == best and pp.best_ratio == pytest.approx(best / 600.0)
        assert pp.study.best_value == pytest.approx(best)
        # the other problem's kernels were added to this study too
        done = [t for t in pp.study.trials if t.state is optuna.trial.TrialState.COMPLETE
                and t.constraints["invalid"] == 0.0]
        assert len(done) == 6


def test_first_batch_is_the_warm_start_seeds(space, tmp_path):
    from cutlass_tune.search import seed_configs

    compiler = FakeCompiler()
    sweep, store = make(space, tmp_path, compiler=compiler, batch=4)
    expected = seed_configs(space, store, list(space.problems), "Fake GPU")[:4]
    sweep.run()
    assert [c.hash for c in compiler.calls[0]] == [c.hash for c in expected]


def test_failed_kernels_are_failed_trials_with_reasons(space, tmp_path):
    compiler, bench = FakeCompiler(fail_tile_n=256), FakeBench(wrong_tile_m=64)
    sweep, store = make(space, tmp_path, bench, compiler, trials=12)
    state = sweep.run()
    failed = good = 0
    for pp in state.problems:
        for t in pp.study.trials:
            cfg = t.user_attrs.get("config", "")
            if t.constraints.get("invalid") == 1.0:
                continue
            if "x256x" in cfg or cfg.split("_")[2].startswith("64x"):
                failed += 1
                assert t.state is optuna.trial.TrialState.FAIL, cfg
                assert t.value is None and t.user_attrs["reason"].split(":")[0] in ("compile_error", "wrong_result")
            else:
                good += 1
                assert t.state is optuna.trial.TrialState.COMPLETE and t.value > 0, cfg
    assert failed > 0 and good > 0
    statuses = {r.status for r in kernel_rows(store)}
    assert Status.OK in statuses


def test_resume_measures_nothing_twice(space, tmp_path):
    first_bench = FakeBench()
    make(space, tmp_path, first_bench, trials=3)[0].run()
    second_bench, compiler = FakeBench(), FakeCompiler()
    state = make(space, tmp_path, second_bench, compiler, trials=7)[0].run()
    assert state.compiled == 7
    assert sum(len(c) for c in compiler.calls) == 4
    assert not set(first_bench.measured) & set(second_bench.measured)


def test_interrupted_sweep_resumes_where_it_stopped(space, tmp_path):
    killed = FakeBench(interrupt_after=10)
    with pytest.raises(KeyboardInterrupt):
        make(space, tmp_path, killed)[0].run()
    store = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    assert len(kernel_rows(store)) == 10  # everything measured before the interrupt was kept
    again = FakeBench()
    state = make(space, tmp_path, again)[0].run()
    assert not set(killed.measured) & set(again.measured)
    assert len(kernel_rows(store)) == 6 * 2 * 4
    rows = collections.Counter((r.problem, r.config_hash, r.runtime) for r in kernel_rows(store))
    assert set(rows.values()) == {1}
    for pp in state.problems:
        assert not [t for t in pp.study.trials if t.state is optuna.trial.TrialState.RUNNING]


def test_store_made_on_another_gpu_is_refused(space, tmp_path):
    store = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.bind_gpu("NVIDIA H100 80GB HBM3")
    with pytest.raises(StoreGpuMismatchError, match="H100"):
        make(space, tmp_path)


@pytest.mark.parametrize("sampler", ["tpe", "gp", "random", "grid"])
def test_every_sampler_runs(space, tmp_path, sampler):
    state = make(space, tmp_path, sampler=sampler, trials=4, batch=2)[0].run()
    assert state.compiled == 4


def test_sweep_resumes_on_every_backend(space, store_url):
    """The same sweep through SQLite and PostgreSQL: Optuna studies and measurements both."""
    first, second = FakeBench(), FakeBench()
    store = ResultStore(store_url)
    Sweep(space, store, store_url, FakeCompiler(), first, SweepSettings(trials=2, batch=2)).run()
    state = Sweep(space, ResultStore(store_url), store_url, FakeCompiler(), second,
                  SweepSettings(trials=4, batch=2)).run()
    assert state.compiled == 4
    assert not set(first.measured) & set(second.measured)
    assert len(kernel_rows(store)) == 4 * 2 * 4


def test_best_at_counts_configs_in_compile_order(space, tmp_path):
    # Regression: every kernel of a batch was credited with the batch's last index.
    compiler = FakeCompiler()
    state = make(space, tmp_path, compiler=compiler, trials=6, batch=6)[0].run()
    order = [c.hash for call in compiler.calls for c in call]
    for pp in state.problems:
        assert order[pp.best_at - 1] == pp.best_config.hash


def test_timeout_stops_proposing(space, tmp_path):
    state = make(space, tmp_path, trials=40, batch=2, timeout_s=1e-9)[0].run()
    assert state.stop_reason == "timeout"
    assert state.compiled == 2  # the first batch was already under way


def test_paired_baselines_rank_the_best_and_fill_the_store(space, tmp_path):
    class PairedBench(FakeBench):
        """cuBLAS, timed beside each kernel, reads 1.5x slower next to 1x1 clusters."""

        def measure(self, kernel, problem, variants, bar=None):
            factor = 1.5 if kernel.config.cluster_m == kernel.config.cluster_n == 1 else 1.0
            for m in super().measure(kernel, problem, variants):
                yield dataclasses.replace(m, baseline_median_ms=m.median_ms * factor) if m.median_ms else m

    sweep, store = make(space, tmp_path, PairedBench(), trials=12, batch=4)
    state = sweep.run()
    rows = [r for r in kernel_rows(store) if r.status is Status.OK]
    for pp in state.problems:
        mine = [r for r in rows if r.problem == pp.problem.name]
        assert pp.best_ratio == pytest.approx(max(r.ratio for r in mine))
        assert (pp.best_config.cluster_m, pp.best_config.cluster_n) == (1, 1)
        # the baseline of each row is its own pair, not the batch's 600 TFLOP/s
        assert {round(r.tflops / r.cublas_tflops, 6) for r in mine} <= {1.0, 1.5}


def test_baseline_is_measured_again_before_each_batch(space, tmp_path):
    class CountingBench(FakeBench):
        calls = 0

        def baseline(self, problem):
            CountingBench.calls += 1
            return super().baseline(problem)

    make(space, tmp_path, CountingBench(), trials=6, batch=2)[0].run()
    assert CountingBench.calls == 2 * (1 + 3)  # two problems: at the start and before 3 batches


def test_epilogue_knobs_are_parameters_only_where_the_space_lists_them(space, tmp_path):
    from cutlass_tune.search import config_of

    sweep, _ = make(space, tmp_path)
    sweep.run()
    for pp in sweep.state.problems:
        for t in pp.study.trials:
            assert "epilogue_tile_n" not in t.params and "epilogue_source" not in t.params

    path = tmp_path / "epilogue.yaml"
    path.write_text(SPACE.replace("  tile_scheduler: [persistent, stream_k]\n",
                                  "  epilogue_tile_n: [auto, 64]\n  epilogue_source: [true, false]\n"))
    epi_space = load_space(path)
    compiler = FakeCompiler()
    (tmp_path / "epi").mkdir()
    sweep, _ = make(epi_space, tmp_path / "epi", compiler=compiler, trials=12)
    sweep.run()
    compiled = [c for call in compiler.calls for c in call]
    assert len(compiled) == 12
    assert {(c.epilogue_tile_n, c.epilogue_source) for c in compiled} > {(0, True)}
    for pp in sweep.state.problems:
        done = [t for t in pp.study.trials if t.state is optuna.trial.TrialState.COMPLETE]
        assert done
        for t in done:
            assert {"epilogue_tile_n", "epilogue_source"} <= set(t.params)
            assert config_of(t.params, pp.problem).hash == t.user_attrs["config_hash"]


def test_a_store_resumes_with_the_c_operand_knob_added_to_its_space(space, tmp_path):
    compiler = FakeCompiler()
    sweep, store = make(space, tmp_path, compiler=compiler)
    sweep.run()
    before = {(r.problem, r.config_hash, r.runtime) for r in kernel_rows(store)}
    path = tmp_path / "wider.yaml"
    path.write_text(SPACE_WITHOUT_C)
    wider, bench = load_space(path), FakeBench()
    sweep, store = make(wider, tmp_path, bench=bench, compiler=compiler, trials=12)
    state = sweep.run()
    compiled = [c for call in compiler.calls for c in call]
    assert len(compiled) == len({c.hash for c in compiled}) == 12  # nothing compiled twice
    assert any(not c.epilogue_source for c in compiled[6:])
    rows = kernel_rows(store)
    assert len(rows) == len({(r.problem, r.config_hash, r.runtime) for r in rows})
    assert before < {(r.problem, r.config_hash, r.runtime) for r in rows}
    assert bench.measured and not {(p, h, v) for h, p, v in bench.measured} & before  # nothing measured twice
    assert state.stop_reason == "trial budget reached"


def test_each_layout_gets_its_own_seeds(tmp_path):
    """A seed's knobs carry no types or layouts: it must go to a study of its own kind, or
    one layout's studies would compile another layout's seeds and miss some of their own."""
    from cutlass_tune.search import seed_configs

    path = tmp_path / "layouts.yaml"
    path.write_text(SPACE.replace("problems:", "layouts: [tn, nt, nn]\nproblems:"))
    space = load_space(path)
    compiler = FakeCompiler()
    sweep, store = make(space, tmp_path, compiler=compiler, trials=60, batch=60)
    seeds = seed_configs(space, store, list(space.problems), "Fake GPU")
    kinds = collections.Counter((c.layout_a, c.layout_b) for c in seeds)
    assert len(kinds) == 3 and len(set(kinds.values())) == 1  # the same seeds for each layout
    sweep.run()
    assert {c.hash for c in compiler.calls[0]} >= {c.hash for c in seeds}


def test_batches_smaller_than_the_studies_ask_every_study_in_turn(tmp_path):
    """One config per batch, six studies, every proposal valid: each batch must ask the study
    after the one the last batch asked, or the first study proposes everything."""
    from cutlass_tune.search import seed_configs

    path = tmp_path / "small.yaml"
    path.write_text("""
problems: [{m: [1024, 4096], n: 4096, k: 4096}]
layouts: [tn, nt, nn]
kernels:
  tile_m: [128]
  tile_n: [64, 128]
  cluster: [1x1, 2x1, 1x2]
  kernel_schedule: [cooperative, pingpong]
""")
    space = load_space(path)
    assert all(not check_config(c) for c in space.candidates)
    compiler = FakeCompiler()
    store = ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")
    seeds = seed_configs(space, store, list(space.problems), "Fake GPU")
    assert len(seeds) == 6  # two per layout, one for each of its two studies
    sweep, store = make(space, tmp_path, compiler=compiler, trials=len(seeds), batch=1)
    sweep.run()
    assert [len(call) for call in compiler.calls] == [1] * 6
    assert {c.hash for call in compiler.calls for c in call} == {c.hash for c in seeds}


def test_several_gpus_share_the_work_and_each_ratio_uses_its_own_cublas(space, tmp_path):
    gpus = [SlowBench(cublas=600.0), SlowBench(cublas=500.0)]
    sweep, store = make(space, tmp_path, gpus, trials=6)
    state = sweep.run()
    measured = gpus[0].measured + gpus[1].measured
    assert gpus[0].measured and gpus[1].measured
    assert len(measured) == len(set(measured)) == 6 * 2 * 4  # each variant once, on one GPU
    # a (kernel, problem) runs on one GPU from its first variant to its last
    on = {(h, p): i for i, g in enumerate(gpus) for h, p, _ in g.measured}
    assert len(on) == 6 * 2
    rows = kernel_rows(store)
    assert len(rows) == 6 * 2 * 4
    for r in rows:
        cublas = gpus[on[(r.config_hash, r.problem)]].cublas
        assert r.cublas_tflops == cublas and r.ratio == pytest.approx(r.tflops / cublas)
    baselines = [r for r in store.rows() if r.kernel == "cuBLAS"]
    assert sorted({r.tflops for r in baselines}) == [500.0, 600.0]  # each GPU's baseline kept
    for pp in state.problems:
        best = max(r.ratio for r in rows if r.problem == pp.problem.name)
        assert pp.best_ratio == pytest.approx(best)
        done = [t for t in pp.study.trials if t.state is optuna.trial.TrialState.COMPLETE
                and t.constraints["invalid"] == 0.0]
        assert len(done) == 6


def test_several_gpus_resume_a_one_gpu_sweep_without_repeats(space, tmp_path):
    make(space, tmp_path, FakeBench(), trials=3)[0].run()
    gpus = [SlowBench(), SlowBench()]
    state = make(space, tmp_path, gpus, trials=6)[0].run()
    assert state.compiled == 6
    rows = kernel_rows(state_store(tmp_path))
    keys = collections.Counter((r.problem, r.config_hash, r.runtime) for r in rows)
    assert len(keys) == 6 * 2 * 4 and set(keys.values()) == {1}


def test_an_interrupt_on_one_gpu_stops_the_sweep_and_keeps_what_was_taken(space, tmp_path):
    gpus = [SlowBench(interrupt_after=5), SlowBench()]
    with pytest.raises(KeyboardInterrupt):
        make(space, tmp_path, gpus)[0].run()
    kept = len(kernel_rows(state_store(tmp_path)))
    assert kept >= 5
    again = FakeBench()
    make(space, tmp_path, again)[0].run()
    rows = kernel_rows(state_store(tmp_path))
    keys = collections.Counter((r.problem, r.config_hash, r.runtime) for r in rows)
    assert len(rows) == 6 * 2 * 4 and set(keys.values()) == {1}
    assert len(again.measured) == len(rows) - kept


def test_gpus_of_different_models_are_refused(space, tmp_path):
    from cutlass_tune.errors import CutlassTuneError

    with pytest.raises(CutlassTuneError, match="Other GPU .* beside Fake GPU"):
        make(space, tmp_path, [SlowBench(), SlowBench(name="Other GPU")])


class LostBench(SlowBench):
    """A GPU that cannot start a worker again after `lose_after` measurements."""

    def __init__(self, lose_after, **kw):
        super().__init__(**kw)
        self.lose_after = lose_after

    def _check(self):
        if len(self.measured) >= self.lose_after:
            raise GpuUnusableError("benchmark worker for GPU 1 did not start within 180 s")

    def baseline(self, problem):
        self._check()
        return super().baseline(problem)

    def measure(self, kernel, problem, variants, bar=None):
        for v in variants:
            self._check()
            yield from super().measure(kernel, problem, [v])


def variant_counts(store):
    return collections.Counter((r.problem, r.config_hash, r.runtime) for r in kernel_rows(store))


@pytest.mark.parametrize("lose_after", [0, 3, 21])  # before its first kernel, within a task, later
def test_a_gpu_lost_mid_sweep_is_given_up_and_the_others_measure_the_rest(space, tmp_path, lose_after):
    # GPU 0 ten times slower, so that GPU 1 surely takes 21 of the 48 measurements before it is lost
    gpus = [SlowBench(cublas=600.0, delay=0.02), LostBench(lose_after, cublas=500.0)]
    sweep, store = make(space, tmp_path, gpus, trials=6)
    state = sweep.run()
    assert state.stop_reason == "trial budget reached"
    assert state.lost == ["benchmark worker for GPU 1 did not start within 180 s"]
    assert len(gpus[1].measured) == lose_after
    counts = variant_counts(store)
    assert len(counts) == 6 * 2 * 4 and set(counts.values()) == {1}  # all of it, nothing twice
    for r in kernel_rows(store):  # each ratio against the cuBLAS of the GPU that measured it
        assert r.ratio == pytest.approx(r.tflops / r.cublas_tflops)
    for pp in state.problems:
        assert pp.cublas_tflops == 600.0
        done = [t for t in pp.study.trials if t.state is optuna.trial.TrialState.COMPLETE
                and t.constraints["invalid"] == 0.0]
        assert len(done) == 6


def test_a_lone_gpu_lost_stops_the_sweep_with_its_reason_and_a_rerun_resumes(space, tmp_path):
    with pytest.raises(GpuUnusableError, match="did not start"):
        make(space, tmp_path, LostBench(10), trials=6)[0].run()
    assert len(kernel_rows(state_store(tmp_path))) == 10
    again = FakeBench()
    make(space, tmp_path, again, trials=6)[0].run()
    counts = variant_counts(state_store(tmp_path))
    assert len(counts) == 6 * 2 * 4 and set(counts.values()) == {1}
    assert len(again.measured) == 6 * 2 * 4 - 10


def state_store(tmp_path):
    return ResultStore(f"sqlite:///{tmp_path / 'store.sqlite'}")


@pytest.mark.parametrize("misjudged", [False, True])
def test_a_sweep_started_on_the_store_meanwhile_neither_breaks_the_first_nor_repeats_it(space, tmp_path,
                                                                                        misjudged):
    """Two hosts on one store: the second starts while the first's first batch compiles, leaves
    the first's batch to it (claimed) and measures configs of its own. The first must still tell
    its trials, must not measure again what the second measured, and counts the second's configs
    against --trials. `misjudged`: the second takes the first for dead when it looks at the
    studies, and fails the first's running trials as left over."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    second_bench = FakeBench()

    class FirstHostCompiler(FakeCompiler):
        def __call__(self, configs):
            if not self.calls:
                store = ResultStore(url)
                if misjudged:
                    store.live_runs = lambda: set()
                Sweep(space, store, url, FakeCompiler(), second_bench, SweepSettings(trials=4, batch=2)).run()
            return super().__call__(configs)

    first_bench = FakeBench()
    state = Sweep(space, ResultStore(url), url, FirstHostCompiler(), first_bench,
                  SweepSettings(trials=8, batch=3)).run()
    rows = kernel_rows(ResultStore(url))
    keys = collections.Counter((r.problem, r.config_hash, r.runtime) for r in rows)
    assert set(keys.values()) == {1}, "a measurement was taken twice"
    assert second_bench.measured and first_bench.measured
    assert not set(first_bench.measured) & set(second_bench.measured)
    assert state.compiled == len({r.config_hash for r in rows}) == 8
    for pp in state.problems:  # the first sweep's results reached its studies
        told = {t.user_attrs.get("config_hash") for t in pp.study.trials
                if t.state is optuna.trial.TrialState.COMPLETE and t.constraints["invalid"] == 0.0}
        assert {r.config_hash for r in rows} <= told


def test_a_trial_another_sweep_finishes_while_this_one_tells_it_keeps_both_results(space, tmp_path, monkeypatch):
    """Two sweeps on one SQLite file can both start the same queued seed (no row lock), and the
    other may tell it between this sweep's calls that tell it: this sweep must not stop, and its
    result must reach its study as a trial of its own."""
    sweep, store = make(space, tmp_path)
    finished_by_other = []
    set_user_attr = optuna.trial.Trial.set_user_attr

    def racing_set_user_attr(trial, key, value):
        if key == "config" and not finished_by_other:
            other = sweep.state.problems[0].study._storage
            other.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.COMPLETE, [1.0])
            finished_by_other.append(trial._trial_id)
        return set_user_attr(trial, key, value)

    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", racing_set_user_attr)
    state = sweep.run()
    assert finished_by_other and state.compiled == 6
    rows = kernel_rows(store)
    for pp in state.problems:
        told = {t.user_attrs.get("config_hash") for t in pp.study.trials
                if t.state is optuna.trial.TrialState.COMPLETE and t.value != 1.0}
        assert {r.config_hash for r in rows} <= told


@pytest.mark.parametrize("interrupt_after", [2, 5])  # within the first kernel, within the second
def test_a_kernel_an_interrupt_left_part_measured_is_finished_on_resume(tmp_path, interrupt_after):
    """With one problem, its study holds the interrupted trial of that kernel, and Optuna skips
    a seed it already holds: the resumed run must finish the kernel without asking the study."""
    path = tmp_path / "space.yaml"
    path.write_text(SPACE.replace("m: [1024, 4096]", "m: 4096"))
    space = load_space(path)
    with pytest.raises(KeyboardInterrupt):
        make(space, tmp_path, FakeBench(interrupt_after=interrupt_after), batch=1)[0].run()
    part = collections.Counter(r.config_hash for r in kernel_rows(state_store(tmp_path)))
    assert sum(part.values()) == interrupt_after and min(part.values()) < 4
    again = FakeBench()
    state = make(space, tmp_path, again, batch=1)[0].run()
    counts = variant_counts(state_store(tmp_path))
    assert len(counts) == 6 * 4 and set(counts.values()) == {1}  # every kernel whole, nothing twice
    assert state.compiled == 6
    (pp,) = state.problems
    told = {t.user_attrs.get("config_hash") for t in pp.study.trials if t.state is optuna.trial.TrialState.COMPLETE}
    assert set(part) <= told  # the finished kernels' results reached the study


class _Stuck(optuna.samplers.RandomSampler):
    """A sampler that proposes one config over and over, as TPE can once it has settled."""

    def __init__(self, params):
        super().__init__(seed=0)
        self.fixed = params

    def sample_independent(self, study, trial, name, distribution):
        return self.fixed[name]


def test_a_stalled_sampler_does_not_stop_the_sweep_short_of_its_budget(space, tmp_path, monkeypatch):
    import cutlass_tune.search._optuna_strategy as strategy_module
    import cutlass_tune.search._studies as studies_module
    from cutlass_tune.search import params_of

    first = next(c for c in space.candidates if not check_config(c))
    monkeypatch.setattr(studies_module, "make_sampler", lambda name, **kw: _Stuck(params_of(first)))
    monkeypatch.setattr(strategy_module, "ASKS_PER_CONFIG", 3)  # each stalled ask costs a few commits
    compiler = FakeCompiler()
    sweep, store = make(space, tmp_path, compiler=compiler, trials=14)  # 8 warm-start seeds, then the sampler
    state = sweep.run()
    assert state.compiled == 14 and state.stop_reason == "trial budget reached"
    compiled = [c.hash for call in compiler.calls for c in call]
    assert len(compiled) == len(set(compiled)) == 14
    assert set(variant_counts(store).values()) == {1}
    for pp in state.problems:  # their results reached the studies
        done = {t.user_attrs.get("config_hash") for t in pp.study.trials
                if t.state is optuna.trial.TrialState.COMPLETE and t.constraints["invalid"] == 0.0}
        assert set(compiled) <= done


def test_each_kernel_is_measured_against_the_problems_best_so_far_and_coarse_rows_never_rank(space, tmp_path):
    class RacingBench(FakeBench):
        """Keeps as coarse, at twice its speed, every variant of a kernel measured below `bar`: a
        coarse figure must neither become the problem's best nor enter its ranking."""

        def __init__(self):
            super().__init__()
            self.bars = []

        def measure(self, kernel, problem, variants, bar=None):
            self.bars.append((problem.name, bar))
            for m in super().measure(kernel, problem, variants):
                if bar is not None and m.tflops < bar:
                    m = dataclasses.replace(m, status=Status.COARSE, tflops=m.tflops * 2)
                yield m

    bench = RacingBench()
    sweep, store = make(space, tmp_path, bench, trials=6, batch=2)
    state = sweep.run()
    first = {}
    for name, bar in bench.bars:
        first.setdefault(name, bar)
    assert set(first.values()) == {None}  # nothing to race against before a problem's first kernel
    assert any(bar is not None for _, bar in bench.bars)
    rows = kernel_rows(store)
    assert any(r.status is Status.COARSE for r in rows)
    for pp in state.problems:
        full = [r.tflops for r in rows if r.problem == pp.problem.name and r.status is Status.OK]
        assert pp.best_tflops == max(full)
        # the coarse rows still give their kernels a value (they steer the search), not a failure
        assert pp.failed == 0


@pytest.mark.parametrize("operation", [dict(epilogue="bias+silu"), dict(dtype="e4m3:bf16", scaling="rowcol")])
def test_a_sweep_of_fused_problems_measures_the_kernels_it_compiles(tmp_path, operation):
    # Regression: configs were mapped back to problems without their epilogue and scaling, so a
    # sweep of bias+silu problems compiled its budget and measured none of it.
    from cutlass_tune.space import sweep_space

    sp = sweep_space(None, "1024x14336x4096,4096x4096x14336", operation.get("dtype"), None,
                     epilogue=operation.get("epilogue"), scaling=operation.get("scaling"))
    compiler = FakeCompiler()
    state = make(sp, tmp_path, FakeBench(), compiler, trials=4, batch=4, strategy="optuna")[0].run()
    assert [pp.measured for pp in state.problems] == [4, 4] and state.invalid == 0
    assert all(c.epilogue == sp.problems[0].epilogue and c.scaling == sp.problems[0].scaling
               for call in compiler.calls for c in call)


@pytest.mark.parametrize("strategy", ["optuna", "prior"])
def test_a_sweep_of_grouped_problems_measures_the_kernels_it_compiles(tmp_path, strategy):
    # Regression: a sweep that maps configs back to problems without their grouping compiles its
    # budget and measures none of it (as fused sweeps once did).
    from cutlass_tune.space import sweep_space

    sp = sweep_space(None, "e128:4096x1536x2048,4096x1536x2048", routing="uniform,zipf")
    compiler = FakeCompiler()
    bench = FakeBench()
    state = make(sp, tmp_path, bench, compiler, trials=6, batch=3, strategy=strategy)[0].run()
    grouped = [pp for pp in state.problems if pp.problem.grouped]
    assert len(grouped) == 2 and all(pp.measured > 0 for pp in state.problems) and state.invalid == 0
    compiled = [c for call in compiler.calls for c in call]
    assert {c.hash for c in compiled if c.grouped} == {h for h, p, _ in bench.measured if "_grouped_" in p}
    # each grouped problem is measured on every grouped kernel compiled, and on no plain one
    for pp in grouped:
        assert {h for h, p, _ in bench.measured if p == pp.problem.name} == {c.hash for c in compiled if c.grouped}


@pytest.mark.parametrize("strategy", ["optuna", "prior"])
def test_a_sweep_of_weight_gradients_measures_their_own_kernels_beside_the_forward(tmp_path, strategy):
    from cutlass_tune.space import Grouping, sweep_space

    sp = sweep_space(None, "dw8:4096x1536x2048,e8:4096x1536x2048")
    compiler = FakeCompiler()
    bench = FakeBench()
    state = make(sp, tmp_path, bench, compiler, trials=6, batch=3, strategy=strategy)[0].run()
    assert all(pp.measured > 0 for pp in state.problems) and state.invalid == 0
    compiled = [c for call in compiler.calls for c in call]
    wgrad = {c.hash for c in compiled if c.grouping is Grouping.GROUPED_K}
    assert wgrad and all(not c.epilogue_source for c in compiled if c.grouping is Grouping.GROUPED_K)
    assert {h for h, p, _ in bench.measured if "_grouped-k_" in p} == wgrad
    # Regression: the best table once left the weight gradients' rows out as damaged (experts on a
    # row it took for a single GEMM's).
    from cutlass_tune.report import load_best

    best = load_best(f"sqlite:///{tmp_path / 'store.sqlite'}")
    wgrad_rows = best[best["grouping"] == Grouping.GROUPED_K.value]
    assert len(wgrad_rows) == 1 and int(wgrad_rows["groups"].iloc[0]) == 8
    assert wgrad_rows["ratio"].notna().all()


def _study_names(space, url):
    return {s.name for s in Studies(space, url, sampler="tpe", seed=0, arch=SweepSettings().arch,
                                    gpu=FakeBench.gpu_name, run_id="look")}


def test_a_second_space_over_the_same_problems_sweeps_into_the_same_store(tmp_path):
    """Another space file's knobs over problems a store's studies already searched (Optuna
    refuses new choices in a study) get studies of their own; each space finds its own again, and
    the problems' measurements from both are in the store."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = space_of(tmp_path / "a", SPACE)
    second = space_of(tmp_path / "b", SPACE.replace("tile_m: [64, 128, 256]", "tile_m: [192]"))
    sweep, store = make(first, tmp_path, trials=4)
    sweep.run()
    named = _study_names(first, store.url)
    sweep, _ = make(second, tmp_path, trials=8)
    sweep.run()
    assert _study_names(second, store.url).isdisjoint(named)
    assert {r.m for r in kernel_rows(store) if "192x" in r.kernel} == {1024, 4096}
    assert len({r.kernel for r in kernel_rows(store) if "192x" not in r.kernel}) >= 4
    assert _study_names(first, store.url) == named


def test_new_run_time_variants_of_measured_configs_are_measured_without_piling_trials(tmp_path):
    """A listed space whose configs the store holds (another space's sweep measured them with
    fewer run-time variants): the sweep measures the missing variants and stops, asking its
    studies no more once each config is awaited or measured whole (it once asked them hundreds
    of times a batch, each ask slower than the last: a sweep that seemed hung)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = space_of(tmp_path / "a", SPACE)
    sweep, store = make(first, tmp_path, trials=48, sampler="grid")
    sweep.run()
    splits = space_of(tmp_path / "b", """
problems: [{m: [1024, 4096], n: 4096, k: 4096}]
kernels:
  - {tile_m: 128, tile_n: 128, cluster: [1x1, 1x2], kernel_schedule: cooperative, tile_scheduler: stream_k}
runtime: {raster: [along_n], swizzle: [1], splits: [1, 2, 4], decomposition: [heuristic, split_k, stream_k]}
""")
    before = len(kernel_rows(store))
    sweep, _ = make(splits, tmp_path, trials=100)
    state = sweep.run()
    assert state.stop_reason == "no new configs proposed"
    added = {r.runtime for r in kernel_rows(store)[before:]}
    assert added >= {"ralong_n_sw1_sp2_split_k", "ralong_n_sw1_sp4_heuristic"}
    assert all(len(s.study.trials) <= 4 for s in Studies(splits, store.url, sampler="tpe", seed=0,
                                                          arch=SweepSettings().arch, gpu=FakeBench.gpu_name,
                                                          run_id="look"))


def test_a_glu_gate_up_problem_sweeps_like_any_other(tmp_path):
    """benchmarks/configs/moe_glu_bf16.yaml (Qwen3-235B's and DeepSeek-V2-Lite's gate_up with
    silu+glu): eleven trials compile its eleven GLU kernels once each and measure each on both."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "moe_glu_bf16.yaml"
    compiler, bench = FakeCompiler(), FakeBench()
    state = make(load_space(path), tmp_path, bench=bench, compiler=compiler, trials=11, batch=11,
                 strategy="optuna")[0].run()
    compiled = [c for call in compiler.calls for c in call]
    assert state.compiled == 11 and len({c.hash for c in compiled}) == 11
    assert all(c.epilogue.name == "silu+glu" for c in compiled)
    assert {h for h, _, _ in bench.measured} == {c.hash for c in compiled}
    assert {p for _, p, _ in bench.measured} == {"32768x3072x4096_bf16bf16bf16_tn_grouped_silu+glu_e128-uniform",
                                                 "24576x2816x2048_bf16bf16bf16_tn_grouped_silu+glu_e64-uniform"}
