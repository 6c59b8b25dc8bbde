import json
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune import BestTable, load_best
from cutlass_tune.measurement import Measurement
from cutlass_tune.space import KernelConfig, Problem, RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore
from cutlass_tune.tables import COLUMNS, BestTableError

from ..cli_run import cli

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "results" / "sweep-nvidia-h200.sqlite"


def run(*args):
    return cli(*args)  # in this process: the commands' output and exit codes, not the interpreter


def test_committed_sweep_gives_one_best_row_per_problem():
    from cutlass_tune.report._best import GROUPED_COLUMNS

    frame = load_best(STORE)
    assert list(frame.columns) == [*COLUMNS, *(c for c in GROUPED_COLUMNS if c not in COLUMNS)]
    assert (frame["grouping"] == "none").all() and (frame["groups"] == 0).all() and (frame["routing"] == "none").all()
    assert sorted(frame["m"]) == [1024, 4096, 8192]
    assert (frame["gpu"] == "NVIDIA H200").all()
    rows = ResultStore(f"sqlite:///{STORE}").rows()
    for r in frame.itertuples():
        same = [x for x in rows if x.problem == r.problem and x.status is Status.OK and x.kernel != "cuBLAS"]
        assert r.ratio == pytest.approx(max(x.ratio for x in same))
        assert r.ratio == pytest.approx(r.tflops / r.cublas_tflops)
        assert KernelConfig.from_dict(json.loads(r.config)).name == r.kernel


def test_lookup_exact_nearest_and_unknown():
    table = BestTable.load(STORE)
    exact = table.lookup(4096, 4096, 4096)
    assert exact.exact and exact.distance == 0 and exact.row["m"] == 4096
    near = table.lookup(6000, 6000, 8192)
    assert not near.exact and near.row["m"] == 8192
    assert table.lookup(900, 1100, 1000).row["m"] == 1024
    assert exact.config.hash == exact.row["config_hash"]
    with pytest.raises(BestTableError, match="no tuned problem for f16 tn"):
        table.lookup(4096, 4096, 4096, dtype="f16")
    with pytest.raises(BestTableError, match="positive"):
        table.lookup(0, 4096, 4096)


def test_lookup_matches_the_output_type_when_asked():
    # Guards against matmul returning an f32 kernel's output for bf16 inputs because that row came first.
    frame = load_best(STORE)
    row = frame.iloc[0]
    f32 = row.copy()
    f32["dtype_d"], f32["kernel"] = "f32", "the f32 kernel"
    table = BestTable(pd.DataFrame([f32, row]))
    assert table.lookup(row.m, row.n, row.k, "bf16", "tn", "bf16").row["kernel"] == row.kernel
    assert table.lookup(row.m, row.n, row.k, "bf16", "tn", "f32").row["kernel"] == "the f32 kernel"
    assert table.lookup(row.m, row.n, row.k, "bf16", "tn").row["kernel"] == "the f32 kernel"  # any output
    with pytest.raises(BestTableError, match="no tuned problem for bf16 -> f16 tn .*bf16 -> bf16 tn"):
        table.lookup(row.m, row.n, row.k, "bf16", "tn", "f16")


def test_lookup_takes_torch_dtypes_and_names_a_dtype_or_layout_it_does_not_know():
    # Guards against lookup(dtype=torch.float16) raising pandas' NotImplementedError.
    torch = pytest.importorskip("torch")
    table = BestTable.load(STORE)
    assert table.lookup(4096, 4096, 4096, dtype=torch.bfloat16, out_dtype=torch.bfloat16).exact
    with pytest.raises(BestTableError, match="no tuned problem for f16 tn"):
        table.lookup(4096, 4096, 4096, dtype=torch.float16)
    with pytest.raises(BestTableError, match="dtype 'torch.int8' is not a dtype of the tables"):
        table.lookup(4096, 4096, 4096, dtype=torch.int8)
    with pytest.raises(BestTableError, match="dtype 'fp16' is not a dtype"):
        table.lookup(4096, 4096, 4096, dtype="fp16")
    with pytest.raises(BestTableError, match="layout 'xt' is not one of nn, nt, tn, tt"):
        table.lookup(4096, 4096, 4096, layout="xt")


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_exported_tables_load_back(tmp_path, fmt):
    path = tmp_path / f"best.{fmt}"
    r = run("best", "--storage", f"sqlite:///{STORE}", "--format", fmt, "-o", path)
    assert r.returncode == 0, r.stderr
    again = load_best(path)
    assert list(again["kernel"]) == list(load_best(STORE)["kernel"])
    assert BestTable(again).lookup(1024, 1024, 1024).exact


def test_best_table_on_screen():
    r = run("best", "--storage", STORE)
    assert r.returncode == 0
    assert "8192x8192x8192_bf16bf16bf16_tn" in r.stdout and "ratio" in r.stdout


def _store_with(tmp_path, measurements):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    store = ResultStore(url)
    store.bind_gpu("NVIDIA H200")
    for m in measurements:
        store.add(m, gpu="NVIDIA H200", run_id="r")
    return url


def test_empty_and_all_failed_stores_are_one_line_errors(tmp_path):
    empty = _store_with(tmp_path / "a", [])
    failed = _store_with(tmp_path / "b", [Measurement(problem=Problem(64, 64, 64), config=KernelConfig(),
                                                      runtime=RuntimeArgs(), status=Status.WRONG_RESULT,
                                                      reason="rel error 0.7 > 0.01")])
    for url, message in ((empty, "has no measurements"), (failed, "no successful measurement: 1 failed")):
        r = run("best", "--storage", url)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and message in r.stderr
    assert "wrong_result: rel error 0.7" in run("best", "--storage", failed).stderr


def test_missing_or_foreign_files(tmp_path):
    with pytest.raises(BestTableError, match="no best-config table"):
        load_best(tmp_path / "nope.csv")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(BestTableError, match="expected a store URL"):
        load_best(tmp_path / "x.txt")
    (tmp_path / "y.csv").write_text("a,b\n1,2\n")
    with pytest.raises(BestTableError, match="missing gpu"):
        load_best(tmp_path / "y.csv")


def test_a_table_written_before_confirmation_still_loads():
    """A `best --format csv` file from before the confirmation columns (tests/report/data)."""
    path = Path(__file__).resolve().parent / "data" / "best-v1.csv"
    table = load_best(path)
    assert len(table) == 4 and list(table["confirm_passes"]) == [0] * 4
    assert list(table["ratio_low"]) == list(table["ratio"]) == list(table["sweep_ratio"])
    assert BestTable.load(path).lookup(8192, 4096, 4096).row["kernel"].startswith("bf16_tn_128x128x64_c1x2")
    assert list(table["epilogue_source"]) == [not k.endswith("_nosrc") for k in table["kernel"]]


def test_a_table_written_before_the_epilogue_knob_columns_still_loads():
    """A `best --format csv` file with confirmation but without fp8_fast_accum, epilogue_tile_n
    and epilogue_source columns (tests/report/data): they are filled from each row's config."""
    table = load_best(Path(__file__).resolve().parent / "data" / "best-v2.csv")
    assert set(COLUMNS) <= set(table.columns)
    for r in table.itertuples():
        cfg = KernelConfig.from_dict(json.loads(r.config))
        assert (r.fp8_fast_accum, r.epilogue_tile_n, r.epilogue_source) == (
            cfg.fp8_fast_accum, cfg.epilogue_tile_n, cfg.epilogue_source)
    assert not table["epilogue_source"].all() and table["confirm_passes"].max() > 0
