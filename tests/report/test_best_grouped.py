"""Best tables and the dashboard of grouped (MoE experts) problems from a store: each routing its
own row, with the grouping, groups and routing columns the runtime's tables look up."""

from cutlass_tune import load_best
from cutlass_tune.measurement import Measurement
from cutlass_tune.report import build_dashboard
from cutlass_tune.report._best import GROUPED_COLUMNS
from cutlass_tune.space import KernelConfig, KernelSchedule, Problem, Routing, RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore

PLAIN = Problem(4096, 1536, 2048)
UNIFORM = Problem.experts(128, 1536, 2048, 4096)
ZIPF = Problem.experts(128, 1536, 2048, 4096, routing=Routing.ZIPF)


def _kernel(problem, median_ms, baseline_ms, **knobs):
    cfg = KernelConfig.for_operation(problem, **knobs)
    return Measurement(problem=problem, config=cfg, runtime=RuntimeArgs(), status=Status.OK, median_ms=median_ms,
                       p20_ms=median_ms, p80_ms=median_ms, samples=50, tflops=problem.flops / (median_ms * 1e9),
                       baseline_median_ms=baseline_ms)


def _baseline(problem, median_ms):
    return Measurement(problem=problem, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                       median_ms=median_ms, p20_ms=median_ms, p80_ms=median_ms, samples=50,
                       tflops=problem.flops / (median_ms * 1e9))


def _store(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    pingpong = dict(kernel_schedule=KernelSchedule.PINGPONG, epilogue_schedule=KernelConfig.epilogue_schedule.TMA)
    for m in (_baseline(PLAIN, 0.10), _kernel(PLAIN, 0.09, 0.10),
              _baseline(UNIFORM, 0.20), _kernel(UNIFORM, 0.16, 0.20), _kernel(UNIFORM, 0.18, 0.20, **pingpong),
              _baseline(ZIPF, 0.30), _kernel(ZIPF, 0.25, 0.30, **pingpong)):
        store.add(m, gpu="NVIDIA H200", run_id="r1")
    return url, store


def test_grouped_rows_keep_their_problem_in_the_store(tmp_path):
    _, store = _store(tmp_path)
    rows = [r for r in store.rows(["problem", "record"]) if r.problem == ZIPF.name]
    assert rows and all(r.measurement().problem == ZIPF for r in rows)
    rebuilt = rows[-1].measurement().problem
    assert rebuilt.group_rows == ZIPF.group_rows and rebuilt.routing is Routing.ZIPF and rebuilt.groups == 128


def test_each_routing_is_its_own_best_row_with_the_grouped_columns(tmp_path):
    url, _ = _store(tmp_path)
    best = load_best(url).set_index("problem")
    assert set(GROUPED_COLUMNS) <= set(best.columns)
    assert list(best.loc[PLAIN.name, list(GROUPED_COLUMNS)]) == ["none", 0, "none"]
    assert list(best.loc[UNIFORM.name, list(GROUPED_COLUMNS)]) == ["grouped", 128, "uniform"]
    assert list(best.loc[ZIPF.name, list(GROUPED_COLUMNS)]) == ["grouped", 128, "zipf"]
    assert best.loc[UNIFORM.name, "ratio"] == 0.20 / 0.16 and "_grouped_" in best.loc[UNIFORM.name, "kernel"]
    assert best.loc[ZIPF.name, "kernel_schedule"] == "pingpong"


def test_the_dashboard_labels_grouped_problems_and_their_reference_figures(tmp_path):
    url, store = _store(tmp_path)
    page = build_dashboard(url)
    assert ZIPF.name in page and "128 experts, zipf routing" in page and "128 experts, uniform routing" in page
    assert "a loop of per-expert GEMMs" not in page  # no reference figures recorded


def test_reference_figures_are_shown_where_the_baseline_carries_them(tmp_path, monkeypatch):
    # The bench stage's grouped baseline may carry a loop of per-expert GEMMs and a dense GEMM.
    url, _ = _store(tmp_path)
    original = Measurement.from_dict

    def with_references(data):
        m = original(data)
        if m.is_baseline and m.problem.grouped:
            object.__setattr__(m, "loop_tflops", 111.0)
            object.__setattr__(m, "dense_tflops", 444.0)
        return m

    monkeypatch.setattr(Measurement, "from_dict", staticmethod(with_references))
    page = build_dashboard(url)
    assert "a loop of per-expert GEMMs 111.0 TFLOP/s" in page and "one dense GEMM of all the rows 444.0" in page
