"""Table files with values out of range: refused with the space files' rules, one line, exit 2."""

import json
import math
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune import load_best
from cutlass_tune.report import write_bundle
from cutlass_tune.tables import BestTableError, BundleError, read_bundle

from ..cli_run import cli

V2 = Path(__file__).resolve().parents[1] / "report" / "data" / "best-v2.csv"


def _rows() -> list[dict]:
    return json.loads(load_best(V2).to_json(orient="records"))


def _table(tmp_path: Path, fmt: str = "json", **changes) -> Path:
    """best-v2 with its row 3 (a persistent, not Stream-K, kernel) changed."""
    rows = _rows()
    rows[2].update(changes)
    path = tmp_path / f"t.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        pd.DataFrame(rows).to_csv(path, index=False)
    return path


BAD = [
    pytest.param({"swizzle": 3}, "swizzle must be 1, 2, 4 or 8", id="swizzle-3"),
    pytest.param({"swizzle": 2 ** 40}, "swizzle must be 1, 2, 4 or 8", id="swizzle-2^40"),
    pytest.param({"splits": 1000}, "splits", id="splits-1000-not-stream-k"),
    pytest.param({"splits": 2}, "Stream-K kernels only", id="splits-on-a-persistent-kernel"),
    pytest.param({"decomposition": "split_k"}, "Stream-K kernels only", id="decomposition-not-stream-k"),
    pytest.param({"m": 2 ** 31}, "problem size", id="m-beyond-int32"),
    pytest.param({"k": 10 ** 30}, "problem size", id="k-beyond-int64"),
    pytest.param({"samples": 10 ** 30}, "samples", id="samples-beyond-int64"),
    pytest.param({"tflops": 10 ** 400}, "tflops", id="tflops-beyond-float"),
    # Regression: a dense row named "1x1x1_..." loaded, keying a 1x1x1 problem to another shape's kernel.
    pytest.param({"problem": "1x1x1_bf16bf16bf16_tn"}, r"problem '1x1x1_bf16bf16bf16_tn' is not named by its shape",
                 id="problem-named-another-shape"),
]


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("changes, message", BAD)
def test_an_out_of_range_value_is_one_line_naming_row(tmp_path, changes, message, fmt):
    # Regression: swizzle 3 / 2^40 and splits 1000 loaded and reached the kernel's arguments;
    # an out-of-range size raised OverflowError.
    path = _table(tmp_path, fmt, **changes)
    with pytest.raises(BestTableError, match=message) as info:
        load_best(path)
    assert "\n" not in str(info.value) and "row 3" in str(info.value)


def test_a_stream_k_row_takes_its_splits(tmp_path):
    # The checks refuse no table `best` writes: Stream-K rows keep their splits and decomposition.
    rows = _rows()
    assert rows[1]["tile_scheduler"] == "stream_k"
    rows[1].update(splits=4, decomposition="split_k")
    (tmp_path / "t.json").write_text(json.dumps(rows))
    assert load_best(tmp_path / "t.json")["splits"][1] == 4
    rows[1]["splits"] = 1000
    (tmp_path / "t.json").write_text(json.dumps(rows))
    with pytest.raises(BestTableError, match="splits must be a number from 1 to"):
        load_best(tmp_path / "t.json")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '[{"gpu": ' + "[" * 100_000 + "]" * 100_000 + "}]"], ids=["rows", "cell"])
def test_a_deeply_nested_json_table_is_one_line(tmp_path, text):
    # Regression: json's RecursionError escaped load_best as a traceback.
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(BestTableError, match="cannot read") as info:
        load_best(tmp_path / "t.json")
    assert "\n" not in str(info.value)


def test_a_deeply_nested_config_cell_is_one_line(tmp_path):
    # Regression: a config cell nested past the recursion limit raised RecursionError.
    path = _table(tmp_path, config="[" * 100_000 + "]" * 100_000)
    with pytest.raises(BestTableError, match="row 3 .*config is not JSON"):
        load_best(path)


def test_a_deeply_nested_bundle_manifest_is_one_line(tmp_path):
    # Regression: a manifest nested past the recursion limit raised RecursionError.
    (tmp_path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BundleError, match="not a bundle manifest"):
        read_bundle(tmp_path)


@pytest.mark.parametrize("command", [["best"], ["export", "-o", "{tmp}/b"]])
@pytest.mark.parametrize("changes", [{"swizzle": 3}, {"k": 10 ** 30}])
def test_the_commands_refuse_an_out_of_range_table(tmp_path, command, changes):
    # Regression: `best` printed a table with swizzle 3 (exit 0); k 10^30 was an OverflowError traceback.
    path = _table(tmp_path, **changes)
    args = [a.format(tmp=tmp_path) for a in command]
    done = _cli(*args, "--storage", str(path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert not (tmp_path / "b").exists()


def test_a_bundle_row_naming_another_configs_kernel_is_one_line(tmp_path):
    # Regression: matmul ran the bundled kernel of the row's config_hash as the row's config said
    # (Stream-K workspace, output dtype, layout), whichever kernel of the bundle that hash named.
    from ..report.test_bundle import STORE, stand_ins

    frame = load_best(STORE)
    bundle = tmp_path / "bundle"
    write_bundle(frame, stand_ins(frame, tmp_path / "cache"), bundle, {})
    rows = json.loads((bundle / "best.json").read_text())
    rows[0]["config_hash"], rows[1]["config_hash"] = rows[1]["config_hash"], rows[0]["config_hash"]
    (bundle / "best.json").write_text(json.dumps(rows))
    with pytest.raises(BundleError, match=f"row 1: config_hash {rows[0]['config_hash']} is not its config's"):
        read_bundle(bundle)
    done = _cli("best", "--storage", str(bundle))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not its config's" in done.stderr


def _damaged_store(tmp_path: Path, sql: str) -> str:
    """A store written through the store API (two kernels on one problem), then damaged by `sql`."""
    import sqlite3

    from cutlass_tune.measurement import Measurement
    from cutlass_tune.space import KernelConfig, Problem, RuntimeArgs
    from cutlass_tune.status import Status
    from cutlass_tune.store import ResultStore

    path = tmp_path / "s.sqlite"
    store = ResultStore(f"sqlite:///{path}")
    store.bind_gpu("NVIDIA H200")
    problem = Problem(4096, 4096, 4096)
    for tile_n, median_ms in ((128, 0.30), (256, 0.25)):
        store.add(Measurement(problem=problem, config=KernelConfig(tile_n=tile_n), runtime=RuntimeArgs(),
                              status=Status.OK, median_ms=median_ms, p20_ms=median_ms, p80_ms=median_ms, samples=50,
                              tflops=problem.flops / (median_ms * 1e9), baseline_median_ms=0.28),
                  gpu="NVIDIA H200", run_id="r")
    db = sqlite3.connect(path)
    db.execute(sql)
    db.commit()
    db.close()
    return str(path)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return cli(*args, cwd=Path.cwd())  # in this process: the command's output and exit code


FASTEST = "(SELECT id FROM ct_measurements ORDER BY tflops DESC LIMIT 1)"


@pytest.mark.parametrize("column, value, message", [
    ("m", "-5", "m -5 is not a positive integer"),
    ("tflops", "9e999", "tflops inf is not a positive number"),
    ("tflops", "-5", "tflops -5.0 is not a positive number"),
    ("problem", "''", "problem '' is not text"),
    ("record", "json_set(record, '$.problem.layout_b', 'zz')", "its record cannot be read"),
    ("record", "json_set(record, '$.problem.dtype_a', 'int4')", "its record cannot be read"),
], ids=["m-negative", "tflops-inf", "tflops-negative", "problem-empty", "layout-zz", "dtype-int4"])
def test_a_damaged_store_row_is_left_out_by_the_table_rules(tmp_path, column, value, message):
    # Regression: such rows reached the table (a TFLOP/s of -5 ranked first) and `export` wrote a
    # bundle its own reader refused; now the row is checked as a table file's and skipped, named.
    url = _damaged_store(tmp_path, f"UPDATE ct_measurements SET {column} = {value} WHERE id = {FASTEST}")
    if column == "record":  # a record no schema reads is the store's damage, not a row to skip
        with pytest.raises(BestTableError, match=message):
            load_best(url)
        return
    with pytest.warns(RuntimeWarning, match=f"measurement 2 .*{message}.*left out"):
        best = load_best(url)
    assert len(best) == 1 and best["median_ms"].tolist() == [0.30]  # the slower kernel, its row intact
    done = _cli("best", "--storage", url)
    assert done.returncode == 0 and f"{best['tflops'][0]:.1f}" in done.stdout and message in done.stderr


@pytest.mark.parametrize("record", ["null", "[" * 100_000 + "]" * 100_000, "[]", "{}"],
                         ids=["null", "nested-100k", "list", "empty-object"])
@pytest.mark.parametrize("command", ["best", "export"])
def test_an_unreadable_record_is_one_line(tmp_path, record, command):
    # Regression: a record nested 100k deep was a RecursionError traceback in best, export and the dashboard.
    url = _damaged_store(tmp_path, f"UPDATE ct_measurements SET record = '{record}' WHERE id = 1")
    args = ["export", "-o", str(tmp_path / "b")] if command == "export" else ["best"]
    done = _cli(*args, "--storage", url)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "is damaged: measurement 1: its record" in done.stderr and not (tmp_path / "b").exists()


def test_the_dashboard_and_confirm_read_an_unreadable_record_as_damage(tmp_path):
    # Regression: the dashboard and confirm raised RecursionError on a record nested 100k deep.
    from cutlass_tune.store import StoreError, open_store

    url = _damaged_store(tmp_path, f"UPDATE ct_measurements SET record = '{'[' * 100_000}' WHERE id = 1")
    with pytest.raises(StoreError, match="is damaged: measurement 1: its record is nested too deeply"):
        open_store(f"sqlite:///{url}").measurements()


@pytest.mark.parametrize("entry", ["kernels/unit0.so", ["kernels/unit0.so", "ct_x"], None, {"library": 7}],
                         ids=["string", "list", "null", "library-not-text"])
def test_a_manifest_kernel_entry_that_is_no_object_is_one_line(tmp_path, entry):
    # Regression: a kernel entry that was a string or a list raised AttributeError.
    from ..report.test_bundle import STORE, stand_ins

    frame = load_best(STORE)
    bundle = tmp_path / "bundle"
    write_bundle(frame, stand_ins(frame, tmp_path / "cache"), bundle, {})
    manifest = json.loads((bundle / "manifest.json").read_text())
    first = sorted(manifest["kernels"])[0]
    manifest["kernels"][first] = entry
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=f"kernel {first} ") as info:
        read_bundle(bundle)
    assert "\n" not in str(info.value)


def test_a_manifest_library_entry_that_is_no_digest_is_one_line(tmp_path):
    from ..report.test_bundle import STORE, stand_ins

    frame = load_best(STORE)
    bundle = tmp_path / "bundle"
    write_bundle(frame, stand_ins(frame, tmp_path / "cache"), bundle, {})
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["libraries"]["kernels/unit0.so"] = ["not", "a", "digest"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="library entry 'kernels/unit0.so' is not a file name with its SHA-256"):
        read_bundle(bundle)


def test_a_bundle_its_reader_refuses_is_never_written(tmp_path):
    # Regression: export wrote bundles that BestTable.load refused (rc 0); now it reads its bundle back first.
    from ..report.test_bundle import STORE, stand_ins

    frame = load_best(STORE)
    bad = frame.assign(tflops=[-5.0, *frame["tflops"][1:]])
    with pytest.raises(BundleError, match="not written: its reader would refuse it .*tflops -5.0"):
        write_bundle(bad, stand_ins(frame, tmp_path / "cache"), tmp_path / "bundle", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_two_rows_for_one_gpu_and_problem_are_refused(tmp_path, fmt):
    # Regression: lookup answered with whichever duplicate came first, whatever its ratio.
    rows = _rows()
    rows.append({**rows[0], "ratio": rows[0]["ratio"] + 0.5})
    path = tmp_path / f"t.{fmt}"
    path.write_text(json.dumps(rows)) if fmt == "json" else pd.DataFrame(rows).to_csv(path, index=False)
    with pytest.raises(BestTableError, match=f"row {len(rows)} .*a second row for {rows[0]['problem']} "
                                             f"on {rows[0]['gpu']} \\(the first is row 1\\)") as info:
        load_best(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("size", [math.nan, math.inf, -math.inf, -1, 0, 2.5, "4096", True, None],
                         ids=["nan", "inf", "-inf", "-1", "0", "2.5", "text", "bool", "none"])
@pytest.mark.parametrize("where", ["m", "n", "k"])
def test_a_lookup_size_that_is_no_positive_whole_number_is_one_line(size, where):
    # Regression: lookup(m=nan) raised pandas' error.
    from cutlass_tune import BestTable

    table = BestTable.load(V2)
    sizes = {"m": 4096, "n": 4096, "k": 4096, where: size}
    with pytest.raises(BestTableError, match=f"lookup: {where} .* is not a positive whole number"):
        table.lookup(**sizes)
    assert table.lookup(4096.0, 4096, 4096).row["m"] == table.lookup(4096, 4096, 4096).row["m"]
