import math
import re
import sqlite3
from pathlib import Path

import optuna
import plotly.offline
import pytest

from cutlass_tune.measurement import Measurement
from cutlass_tune.report._dashboard import build_dashboard, write_dashboard
from cutlass_tune.settings import DEFAULT_STORE
from cutlass_tune.space import Activation, Epilogue, KernelConfig, Problem, RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore

from ..cli_run import cli

REPO = Path(__file__).resolve().parents[2]
STORE_URL = f"sqlite:///{REPO / 'results' / 'sweep-nvidia-h200.sqlite'}"
PROBLEMS = [f"{s}x{s}x{s}_bf16bf16bf16_tn" for s in (1024, 4096, 8192)]
SECTIONS = ("tile", "schedule", "raster", "history", "importance", "compile", "failures")
HOSTILE = "<script>alert(1)</script>"
P = Problem(4096, 4096, 4096)
CFG = KernelConfig(tile_n=256, cluster_m=2)


def run(*args):
    return cli(*args)  # in this process: the commands' output and exit codes, not the interpreter


def ok(config=CFG, tflops=600.0, runtime=RuntimeArgs(), **kw):
    timing = {"median_ms": P.flops / tflops / 1e9, "p20_ms": 0.1, "p80_ms": 0.2, **kw}
    return Measurement(problem=P, config=config, runtime=runtime, status=Status.OK, tflops=tflops, samples=100,
                       method="events", compile_seconds=30.0, **timing)


def make_store(path, measurements):
    url = f"sqlite:///{path}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    for m in measurements:
        store.add(m, gpu="NVIDIA H200", run_id="r1", cublas_tflops=None if m.is_baseline else 700.0)
    return url


@pytest.fixture(scope="module")
def committed_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("dashboard") / "report.html"
    report = write_dashboard(STORE_URL, path)
    return report, path.read_text(encoding="utf-8")


def test_report_of_the_committed_store_is_self_contained(committed_report):
    report, page = committed_report
    bundle = plotly.offline.get_plotlyjs()
    assert page.count(bundle) == 1
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE)
    rest = page.replace(bundle, "")
    # plotly.js itself names a map-data CDN it never fetches for these charts; nothing else may.
    assert "cdn.plot.ly" not in rest and "http://" not in rest and "https://" not in rest
    assert "<link" not in rest and "@import" not in rest
    assert report.problems == tuple(PROBLEMS) and report.measurements == 1119


def test_report_has_every_section_and_a_selector_option_per_problem(committed_report):
    _, page = committed_report
    assert 'id="summary"' in page and 'id="summary-ratio"' in page
    for i in range(len(PROBLEMS)):
        for section in SECTIONS:
            assert f'<div id="p{i}-{section}" class="plotly-graph-div"' in page, (i, section)
    assert page.count("Plotly.newPlot(") == 2 + len(PROBLEMS) * len(SECTIONS)
    assert re.findall(r'<option value="(p\d+)">([^<]*)</option>', page) == [
        (f"p{i}", p) for i, p in enumerate(PROBLEMS)]
    for i, p in enumerate(PROBLEMS):
        assert f'<section class="problem" id="p{i}" data-problem="{p}">' in page


def test_report_states_gpu_runs_and_timing(committed_report):
    _, page = committed_report
    assert "NVIDIA H200" in page and "5906f1865bbb" in page and "2026-11-21T06:07:29+00:00" in page
    assert "L2-cold CUDA events; each problem's baseline measured in the same run: cuBLAS" in page
    assert "successful measurements (config x run-time variant) of the store" in page
    assert "65 invalid proposals" in page


def test_hostile_names_and_reasons_are_escaped(tmp_path):
    url = make_store(tmp_path / "s.sqlite", [
        Measurement(problem=P, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                    tflops=700.0, median_ms=0.2, method="events"),
        ok(),
        ok(config=None, symbol=HOSTILE, tflops=900.0),
        Measurement(problem=P, config=CFG, runtime=RuntimeArgs(swizzle=8), status=Status.WRONG_RESULT,
                    reason=HOSTILE),
    ])
    page = build_dashboard(url)
    assert "alert(1)" in page
    assert "<script>alert(1)" not in page and "</script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the best kernel, in the table


def test_a_store_without_studies_notes_it_and_gains_no_tables(tmp_path):
    """Regression: opening Optuna's storage on a plain store created Optuna's tables in it."""
    url = make_store(tmp_path / "s.sqlite", [ok(), ok(runtime=RuntimeArgs(swizzle=4), tflops=610.0)])
    page = build_dashboard(url)
    assert "no Optuna study in this store" in page
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "studies" not in tables


def test_cli_writes_the_report_of_the_default_store(tmp_path):
    out = tmp_path / "sub" / "r.html"
    r = run("dashboard", "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}: ") and f"measurements from sqlite:///{DEFAULT_STORE}" in r.stdout
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in out.parent.iterdir()] == ["r.html"]  # no temporary file left


@pytest.mark.parametrize("rows,message", [
    ([], "has no measurements: run `cutlass-tune sweep` first"),
    ([Measurement(problem=P, config=CFG, runtime=RuntimeArgs(), status=Status.WRONG_RESULT,
                  reason="rel error 0.5\nsecond line"),
      Measurement(problem=P, config=CFG, runtime=RuntimeArgs(swizzle=4), status=Status.WRONG_RESULT,
                  reason="rel error 0.5\nsecond line"),
      Measurement(problem=P, config=KernelConfig(), runtime=RuntimeArgs(), status=Status.COMPILE_ERROR,
                  reason="nvcc failed")],
     "has no successful measurement: 3 failed (most common reason: wrong_result: rel error 0.5)"),
    ([Measurement(problem=P, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                  tflops=700.0, median_ms=0.2)],
     "has only baselines (cuBLAS, torch), no kernel measurement"),
])
def test_stores_with_nothing_to_show_are_one_line_errors(tmp_path, rows, message):
    url = make_store(tmp_path / "s.sqlite", rows)
    r = run("dashboard", "--storage", url, "-o", tmp_path / "r.html")
    assert r.returncode == 2
    assert r.stderr.startswith("error: store sqlite:///") and message in r.stderr
    assert r.stderr.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_a_missing_store_file_is_not_created(tmp_path):
    r = run("dashboard", "--storage", f"sqlite:///{tmp_path / 'none' / 's.sqlite'}", "-o", tmp_path / "r.html")
    assert r.returncode == 2 and r.stderr.startswith("error: no store at") and r.stderr.count("\n") == 1
    assert not (tmp_path / "none").exists()


def test_optuna_dashboard_sees_the_three_studies():
    # optuna-dashboard lists a storage through get_all_study_summaries.
    summaries = optuna.get_all_study_summaries(storage=STORE_URL)
    assert sorted(s.study_name for s in summaries) == [f"{p}_sm90a_NVIDIA-H200" for p in PROBLEMS]
    assert all(s.n_trials > 0 and s.direction == optuna.study.StudyDirection.MAXIMIZE for s in summaries)


def test_a_problem_with_only_failures_keeps_its_section(tmp_path):
    other = Problem(1024, 1024, 1024)
    url = make_store(tmp_path / "s.sqlite", [
        ok(), Measurement(problem=other, config=CFG, runtime=RuntimeArgs(), status=Status.COMPILE_ERROR,
                          reason="nvcc died", compile_seconds=3.0)])
    page = build_dashboard(url)
    assert f'<option value="p1">{other.name}</option>' in page
    assert "No successful measurement of this problem." in page
    assert '<div id="p1-failures" class="plotly-graph-div"' in page


def test_a_store_measured_on_two_gpus_shows_each_gpus_share_and_cublas(tmp_path):
    import dataclasses

    from cutlass_tune.measurement import EnvStamp

    env = EnvStamp(host="h", gpu="NVIDIA H200", capability="9.0", sm_count=132, l2_bytes=50 << 20,
                   driver="580", cuda_runtime="13.0", torch="2.11", nvcc="13.0", cutlass="4.2.0")
    boards = [dataclasses.replace(env, device=d, gpu_uuid=f"GPU-board-{d}") for d in (1, 0)]
    base = Measurement(problem=P, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                       tflops=0.0, median_ms=1.0, p20_ms=1.0, p80_ms=1.0, samples=10, method="events")
    rows = [dataclasses.replace(base, tflops=t, env=e) for t, e in ((680.0, boards[0]), (700.0, boards[1]))]
    rows += [ok(tflops=600.0 + i, runtime=RuntimeArgs(swizzle=s), env=boards[i % 2])
             for i, s in enumerate((1, 2, 4))]
    page = build_dashboard(make_store(tmp_path / "two.sqlite", rows))
    table = page[page.index('<table class="boards">'):]
    table = table[:table.index("</table>")]
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in table.split("<tr>")[2:]]
    # board 0 first; its cuBLAS 700 against the boards' mean 690, board 1's 680
    assert cells == [["<code>GPU-board-0</code>", "0", "1", "0", "1.014"],
                     ["<code>GPU-board-1</code>", "1", "2", "0", "0.986"]]


def test_a_store_measured_on_one_gpu_has_no_gpu_table(committed_report):
    _, page = committed_report
    assert 'class="boards"' not in page


def test_a_fused_problem_shows_its_epilogue_and_both_torch_baselines(tmp_path):
    fused = Problem(4096, 4096, 4096, epilogue=Epilogue(bias=True, activation=Activation.SILU))
    eager_ms, compile_ms, kernel_ms = 0.30, 0.25, 0.24
    eager = Measurement(problem=fused, config=None, runtime=RuntimeArgs(), status=Status.OK, symbol="torch eager",
                        is_baseline=True, tflops=fused.flops / eager_ms / 1e9, median_ms=eager_ms, p20_ms=eager_ms,
                        p80_ms=eager_ms, samples=50, method="events", compile_median_ms=compile_ms)
    kernel = Measurement(problem=fused, config=KernelConfig(epilogue=fused.epilogue), runtime=RuntimeArgs(),
                         status=Status.OK, tflops=fused.flops / kernel_ms / 1e9, median_ms=kernel_ms, p20_ms=kernel_ms,
                         p80_ms=kernel_ms, samples=50, method="events", baseline_median_ms=eager_ms)
    url = make_store(tmp_path / "s.sqlite", [
        Measurement(problem=P, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                    tflops=700.0, median_ms=0.2, method="events"), ok(), eager, kernel])
    page = build_dashboard(url)
    best = page[page.index('<table class="best">'):]
    best = best[:best.index("</table>")]
    rows = re.findall(r"<tr data-epilogue=\"([^\"]*)\">(.*?)</tr>", best)
    assert [e for e, _ in rows] == ["none", "bias+silu"]
    cells = re.findall(r"<td>(.*?)</td>", rows[1][1])
    assert cells[0] == fused.name and cells[1] == "bias+silu" and cells[5] == "torch eager"
    assert cells[7] == f"{eager_ms / kernel_ms:.3f}" and cells[9] == f"{compile_ms / kernel_ms:.3f}"
    plain = re.findall(r"<td>(.*?)</td>", rows[0][1])
    assert plain[5] == "cuBLAS" and plain[8] == plain[9] == "-"
    assert f"epilogue bias+silu; torch eager {fused.flops / eager_ms / 1e9:.1f} TFLOP/s, torch.compile " \
           f"{fused.flops / compile_ms / 1e9:.1f} TFLOP/s" in page
    assert "torch.compile (same run)" in page and r"cuBLAS \u002f torch eager (same run)" in page  # plotly escapes /


def _figure(page, div_id):
    """The JSON of the plotly figure drawn in `div_id` (data and layout, as the page passes them)."""
    import json

    decoder = json.JSONDecoder()
    start = page.index("[", page.index(f'Plotly.newPlot(                        "{div_id}",'))
    data, end = decoder.raw_decode(page, start)
    layout, _ = decoder.raw_decode(page, page.index("{", end))
    return [{k: _array(v) for k, v in trace.items()} for trace in data], layout


def _array(value):
    """A figure's value; plotly writes numeric arrays as base64 (`bdata`), here decoded to a list."""
    import base64

    import numpy as np

    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    if isinstance(value, dict):
        return {k: _array(v) for k, v in value.items()}
    return value


def _paired(tflops, baseline_tflops, runtime=RuntimeArgs(), spread=0.05):
    ms = P.flops / tflops / 1e9
    return ok(tflops=tflops, runtime=runtime, baseline_median_ms=P.flops / baseline_tflops / 1e9,
              p20_ms=ms * (1 - spread), p80_ms=ms * (1 + spread), median_ms=ms)


@pytest.fixture
def paired_page(tmp_path):
    """A problem whose baseline rows read 720 TFLOP/s unpaired while every kernel was paired
    with a baseline at 676.2 (the 4096^3 of the committed H100 store, issue of the dashed line)."""
    base = [Measurement(problem=P, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                        tflops=t, median_ms=P.flops / t / 1e9, method="events") for t in (710.0, 720.6, 730.0)]
    kernels = [_paired(677.9, 676.2, RuntimeArgs(swizzle=8)), _paired(650.0, 676.2, RuntimeArgs(swizzle=1)),
               _paired(660.0, 676.2, RuntimeArgs(swizzle=2), spread=0.1),
               _paired(640.0, 676.2, RuntimeArgs(swizzle=4)),
               Measurement(problem=P, config=KernelConfig(tile_n=128), runtime=RuntimeArgs(),
                           status=Status.COMPILE_ERROR, reason="ptxas error: too many registers\nlog",
                           compile_seconds=3.0)]
    return build_dashboard(make_store(tmp_path / "s.sqlite", [*base, *kernels]))


def test_the_baseline_drawn_is_the_one_each_ratio_was_paired_with(paired_page):
    """Guards the dashed cuBLAS line drawn at the median of all baseline rows (720.6) above a won problem (676.2)."""
    assert "cuBLAS 676.2 TFLOP/s" in paired_page and "720.6" not in paired_page
    data, layout = _figure(paired_page, "p0-history")
    points = [s["y"] for s in data if s["name"].startswith("config")][0]
    assert points[0] == pytest.approx(677.9 / 676.2) and math.isnan(points[1])  # the failed config: no point
    assert [(line["y0"], line["y1"]) for line in layout["shapes"]] == [(1.0, 1.0)]  # every point's own baseline


def test_spread_is_shown_as_error_bars_and_in_the_table(paired_page):
    """Guards a dashboard with no spread anywhere."""
    ms = P.flops / 677.9 / 1e9
    low, high = 677.9 * ms / (ms * 1.05), 677.9 * ms / (ms * 0.95)
    row = re.findall(r"<td>(.*?)</td>", paired_page[paired_page.index('<tr data-epilogue="none">'):])[:13]
    assert row[11] == f"{low:.1f}-{high:.1f}" and row[12] == f"{low / 676.2:.3f}-{high / 676.2:.3f}"
    data, layout = _figure(paired_page, "summary")
    bars = data[0]["error_y"]
    assert bars["array"][0] == pytest.approx(high - 677.9) and bars["arrayminus"][0] == pytest.approx(677.9 - low)
    history, _ = _figure(paired_page, "p0-history")
    assert history[0]["error_y"]["array"][0] == pytest.approx(high / 676.2 - 677.9 / 676.2)


def test_small_problems_are_visible_on_a_log_axis_and_as_ratios(paired_page):
    """Guards absolute TFLOP/s on a linear axis, which flattened 128^3 against 8192^3."""
    _, layout = _figure(paired_page, "summary")
    assert layout["yaxis"]["type"] == "log"
    data, _ = _figure(paired_page, "summary-ratio")
    assert data[0]["y"] == [pytest.approx(677.9 / 676.2)]


def test_the_best_table_keeps_every_row_in_a_scrolling_box(committed_report):
    """Guards the table cut at 1600 px."""
    _, page = committed_report
    box = page[page.index('<div class="scroll"><table class="best">'):]
    box = box[:box.index("</table></div>")]
    assert len(re.findall(r"<tr data-epilogue=", box)) == len(PROBLEMS)
    assert re.search(r"\.scroll \{ overflow: auto; max-width: 100%; \}", page)
    assert "max-height: 1600" not in page


def test_importances_include_the_run_time_knobs(paired_page):
    """Guards importances of compile-time knobs only (the study's trials lack raster, swizzle, splits)."""
    data, _ = _figure(paired_page, "p0-importance")
    assert "swizzle" in data[0]["y"]
    assert data[0]["customdata"][data[0]["y"].index("swizzle")] == "run-time"


def test_each_failed_config_is_listed_with_its_reason(paired_page, tmp_path):
    """Guards FAIL entries without their status and message."""
    failures = paired_page[paired_page.index('<table class="failures">'):]
    assert "<td>compile_error</td><td>ptxas error: too many registers</td><td>measurement</td>" in failures
    data, _ = _figure(paired_page, "p0-compile")
    failed = [list(c) for s in data if s["name"] == "failed" for c in s["customdata"]]
    assert [KernelConfig(tile_n=128).name, "compile_error: ptxas error: too many registers"] in failed


def test_failed_and_invalid_trials_of_the_study_show_their_reason(tmp_path):
    url = make_store(tmp_path / "s.sqlite", [ok(), ok(runtime=RuntimeArgs(swizzle=4), tflops=610.0)])
    study = optuna.create_study(study_name=f"{P.name}_sm90a_NVIDIA-H200", storage=url, direction="maximize")
    dist = {"tile_n": optuna.distributions.CategoricalDistribution(["128", "256"])}
    for state, attrs, invalid in ((optuna.trial.TrialState.FAIL, {"config": "cfg_a", "reason": "interrupted"}, 0.0),
                                  (optuna.trial.TrialState.PRUNED,
                                   {"config": "cfg_b", "reason": "smem_capacity: 9 stages need 300 KB"}, 1.0)):
        study.add_trial(optuna.trial.create_trial(params={"tile_n": "128"}, distributions=dist, state=state,
                                                  user_attrs=attrs, constraints={"invalid": invalid}))
    page = build_dashboard(url)
    assert "<td>failed trial</td><td>interrupted</td><td>Optuna study</td>" in page
    assert "<td>invalid</td><td>smem_capacity: 9 stages need 300 KB</td><td>Optuna study</td>" in page


def test_the_page_says_why_the_heatmaps_best_differs_from_the_table_s(committed_report):
    """Guards heatmaps showing a higher best (684 TFLOP/s) than the table (677.9) with no word on why."""
    from cutlass_tune.report._dashboard import HEATMAP_NOTE

    _, page = committed_report
    assert "not the highest TFLOP/s of one measurement, which the heatmaps below show" in page
    sections = page.split('<section class="problem"')[1:]
    assert len(sections) == len(PROBLEMS)
    for section in sections:
        tile = section[section.index('data-section="tile"'):section.index('data-section="schedule"')]
        assert f'<p class="note">{HEATMAP_NOTE}</p>' in tile.replace("&#39;", "'").replace("&#x27;", "'")
