"""Bad input to best-config tables: broken or wrong files, damaged stores, unwritable outputs.
Each is one line (BestTableError, or StoreError for a store of another schema), never a
traceback, and nothing is left half-written."""

import errno
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune import load_best
from cutlass_tune.kernel import ABI_VERSION
from cutlass_tune.report import same_file, write_table
from cutlass_tune.space import KernelConfig, check_config
from cutlass_tune.store import StoreError
from cutlass_tune.tables import BestTableError

from ..cli_run import cli

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "results" / "sweep-nvidia-h200.sqlite"
V2 = Path(__file__).resolve().parent / "data" / "best-v2.csv"


def run(*args):
    return cli(*args)  # in this process: the commands' output and exit codes, not the interpreter


def one_line_error(call, match):
    with pytest.raises(BestTableError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
    return str(info.value)


# ---- table files that are not tables -------------------------------------------------------

@pytest.mark.parametrize("name, content, cause", [
    ("object.json", b'{"x": 1}', "expected a list of rows, found an object"),  # was "If using all scalar values"
    ("string.json", b'"str"', "expected a list of rows, found a string"),
    ("rows.json", b"[1, 2]", "row 1 is a number, not an object"),
    ("broken.json", b"{not json", "JSONDecodeError: Expecting property name"),
    ("latin1.json", b'[{"gpu": "\xe9"}]', "UnicodeDecodeError: 'utf-8' codec can't decode"),
    ("empty.csv", b"", "EmptyDataError: No columns to parse"),
    ("fake.parquet", b"not parquet at all", "parquet"),  # ArrowInvalid with pyarrow, "needs pyarrow" without
])
def test_a_broken_table_file_is_one_line_naming_it(tmp_path, name, content, cause):
    """Guards against a traceback from pandas' reader for a file that is not a table."""
    (tmp_path / name).write_bytes(content)
    message = one_line_error(lambda: load_best(tmp_path / name), "cannot read")
    assert str(tmp_path / name) in message and cause in message


def test_a_broken_table_file_is_one_line_in_the_cli(tmp_path):
    """Guards against `best --storage broken.json` printing a traceback instead of exit 2."""
    (tmp_path / "t.json").write_text('{"x": 1}')
    r = run("best", "--storage", tmp_path / "t.json")
    assert r.returncode == 2 and r.stderr.startswith(f"error: cannot read {tmp_path / 't.json'}")
    assert r.stderr.count("\n") == 1


# ---- tables whose values are not what their columns hold ------------------------------------

def edited(tmp_path, row, column, value, fmt="csv"):
    """best-v2.csv with one cell changed (row 1-based), written as `fmt`."""
    frame = pd.read_csv(V2, dtype=str)
    frame.loc[row - 1, column] = value
    path = tmp_path / f"t.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        path.write_text(json.dumps(frame.to_dict("records")))
    return path


@pytest.mark.parametrize("column, value, message", [
    ("config", "{not json", r"row 2 \(4096x6656x17920_bf16bf16bf16_tn\): config is not JSON"),
    ("config", '{"tile_m": 128, "bogus": 1}', r"row 2 .*config is not a kernel config \(unknown KernelConfig fields"),
    ("config", '{"dtype_a": "bf17"}', r"row 2 .*config is not a kernel config \('bf17' is not a valid DType"),
    ("config", '{"tile_m": "abc"}', r"row 2 .*config is not a kernel config \(tile_m 'abc' is not int"),
    ("config", "[1, 2]", r"row 2 .*config '\[1, 2\]' is not a JSON object"),
    ("m", "abc", r"row 2 .*: m 'abc' is not a positive integer"),
    ("k", "", r"row 2 .*: k \(empty\) is not a positive integer"),
    ("n", "-4096", r"row 2 .*: n -4096 is not a positive integer"),
    ("ratio", "xyz", r"row 2 .*: ratio 'xyz' is not a number"),  # crashed formatting: "Unknown format code 'f'"
    ("tflops", "", r"row 2 .*: tflops \(empty\) is not a positive number"),
    ("raster", "diagonal", r"row 2 .*: raster 'diagonal' is not one of heuristic, along_m, along_n"),
    ("decomposition", "sideways", r"row 2 .*: decomposition 'sideways' is not one of heuristic, data_parallel"),
    ("layout", "tx", r"row 2 .*: layout 'tx' is not one of tn, nt, nn, tt"),
    ("dtype_a", "bf17", r"row 2 .*: dtype_a 'bf17' is not one of bf16, e4m3"),
    ("swizzle", "0", r"row 2 .*: swizzle 0 is not a positive integer"),
    ("gpu", "", r"row 2 .*: gpu \(empty\) is not text"),
    ("tile_n", "abc", r"row 2 .*: tile_n 'abc' is not its config's 256"),
])
def test_a_bad_value_is_one_line_naming_row_and_column(tmp_path, column, value, message):
    """Guards against bad cells loading silently and failing later (export's JSONDecodeError,
    the table's format codes, RasterOrder lookups) instead of naming the row and column."""
    path = edited(tmp_path, 2, column, value)
    one_line_error(lambda: load_best(path), f"{path}: {message}")


def test_null_sizes_in_a_json_table_are_refused(tmp_path):
    """Guards against `"m": null` in a JSON table loading as a NaN problem size."""
    rows = json.loads(load_best(V2).to_json(orient="records"))
    for value, shown in ((None, r"\(empty\)"), ("abc", "'abc'"), (True, "True"), (1.5, "1.5")):
        rows[2]["m"] = value
        (tmp_path / "t.json").write_text(json.dumps(rows))
        one_line_error(lambda: load_best(tmp_path / "t.json"),
                       rf"row 3 \(4096x19968x6656_bf16bf16bf16_tn\): m {shown} is not a positive integer")


def test_a_table_with_no_rows_is_refused(tmp_path):
    """Guards against a header-only table loading as empty (exit 0) and `export` shipping 0 problems."""
    pd.read_csv(V2).iloc[:0].to_csv(tmp_path / "header.csv", index=False)
    (tmp_path / "none.json").write_text("[]")
    for path in (tmp_path / "header.csv", tmp_path / "none.json"):
        one_line_error(lambda: load_best(path), f"{path} has no rows")
    for command in ("best", "export"):
        extra = ["-o", tmp_path / "bundle"] if command == "export" else []
        r = run(command, "--storage", tmp_path / "header.csv", *extra)
        assert r.returncode == 2 and "has no rows" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "bundle").exists()


def test_values_load_with_their_column_kinds(tmp_path):
    """Guards against an empty ratio loading as None or text, and against a config hash or run
    id made of digits being read as a number."""
    path = edited(tmp_path, 2, "ratio", "")
    frame = pd.read_csv(path, dtype=str)
    frame.loc[0, "config_hash"], frame.loc[0, "run_id"] = "0012345678901234", "0042"
    frame.to_csv(path, index=False)
    path.with_suffix(".json").write_text(json.dumps(frame.to_dict("records")))
    for table in (load_best(path), load_best(path.with_suffix(".json"))):
        assert table["ratio"].dtype == float and pd.isna(table["ratio"][1])
        assert table["m"].dtype == "int64" and table["tile_n"].dtype == "int64"
        assert (table["config_hash"][0], table["run_id"][0]) == ("0012345678901234", "0042")
    r = run("best", "--storage", path)
    assert r.returncode == 0 and "nan" not in r.stdout and " - " in r.stdout, r.stderr  # shown as -


def test_configs_the_current_rules_reject_still_load(tmp_path):
    """Guards against the value checks refusing older tables whose configs today's rules would not build."""
    old = KernelConfig(tile_m=100)
    assert check_config(old)  # rejected by the rules ...
    path = edited(tmp_path, 1, "config", json.dumps(old.to_dict(), sort_keys=True))
    frame = pd.read_csv(path, dtype=str)
    frame.loc[0, ["tile_m", "tile_n", "cluster_n", "kernel_schedule", "epilogue_schedule"]] = [
        "100", "128", "1", "cooperative", "tma_cooperative"]
    frame.to_csv(path, index=False)
    assert load_best(path)["tile_m"][0] == 100  # ... but it parses, so the table loads


def test_a_bundle_with_a_corrupt_table_is_one_line(tmp_path):
    """Guards against a bundle whose best.json is damaged raising a traceback from the reader."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"format": 1, "abi_version": ABI_VERSION,
                                                      "libraries": {}, "kernels": {}}))
    (bundle / "best.json").write_text("{not json")
    one_line_error(lambda: load_best(bundle), f"cannot read {bundle / 'best.json'} as a json table")


# ---- damaged stores --------------------------------------------------------------------------

def store_copy(tmp_path, *statements):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "s.sqlite"
    shutil.copyfile(STORE, path)
    with sqlite3.connect(path) as db:
        for sql in statements:
            db.execute(sql)
    return path


@pytest.mark.parametrize("record, cause", [
    ("{not json", "JSONDecodeError"),
    ("{}", "unknown measurement schema None"),
    ('{"schema": 2}', "KeyError: 'problem'"),
])
def test_a_damaged_stored_record_is_one_line_naming_its_row(tmp_path, record, cause):
    """Guards against a traceback from Measurement.from_dict when one stored record is damaged."""
    (bad,) = sqlite3.connect(STORE).execute("SELECT id FROM ct_measurements WHERE kernel != 'cuBLAS' "
                                            "ORDER BY id LIMIT 1 OFFSET 3").fetchone()
    path = store_copy(tmp_path, f"UPDATE ct_measurements SET record = '{record}' WHERE id = {bad}")
    message = one_line_error(lambda: load_best(path), f"store sqlite:///{path} is damaged: measurement {bad}: ")
    assert "cannot be read" in message and cause in message
    r = run("best", "--storage", path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"measurement {bad}: " in r.stderr


def test_a_store_of_another_schema_is_refused(tmp_path):
    """Guards against `best` reading a store whose ct_meta says schema 99 (`sweep` refuses it)."""
    path = store_copy(tmp_path, "UPDATE ct_meta SET value = '99' WHERE key = 'schema'")
    with pytest.raises(StoreError, match=f"the store sqlite:///{path} has schema 99, this version reads 1"):
        load_best(path)
    r = run("best", "--storage", path)
    assert r.returncode == 2 and "has schema 99" in r.stderr and r.stderr.count("\n") == 1


def test_kernels_without_a_cublas_figure_rank_last_and_print(tmp_path):
    """Guards against NULL ratio and cublas_tflops (an unpaired store) reaching the table as
    None, which crashed `best`'s formatting, or outranking a kernel with a ratio."""
    all_null = store_copy(tmp_path / "a", "UPDATE ct_measurements SET ratio = NULL, cublas_tflops = NULL")
    frame = load_best(all_null)
    assert frame["ratio"].dtype == float and frame["cublas_tflops"].dtype == float and frame["ratio"].isna().all()
    r = run("best", "--storage", all_null)
    assert r.returncode == 0 and "nan" not in r.stdout and " - " in r.stdout, r.stderr  # shown as -
    for fmt in ("csv", "json"):  # and the table written from it loads back
        r = run("best", "--storage", all_null, "--format", fmt, "-o", tmp_path / f"t.{fmt}")
        assert r.returncode == 0, r.stderr
        assert load_best(tmp_path / f"t.{fmt}")["ratio"].isna().all()

    best = load_best(STORE).iloc[0]
    fastest = store_copy(tmp_path / "b", "UPDATE ct_measurements SET ratio = NULL, cublas_tflops = NULL, "
                         f"tflops = 1e6 WHERE problem = '{best.problem}' AND config_hash != '{best.config_hash}'"
                         " AND kernel != 'cuBLAS'")
    again = load_best(fastest)
    assert again.iloc[0]["config_hash"] == best.config_hash  # the ratio ranks first, not the TFLOP/s


# ---- writing tables --------------------------------------------------------------------------

@pytest.fixture
def frame():
    return load_best(V2)


def leftovers(folder):
    return sorted(p.name for p in Path(folder).iterdir() if ".tmp" in p.name)


@pytest.mark.parametrize("target, reason", [
    ("folder", "Is a directory"),
    ("no/such/folder/t.csv", "No such file or directory"),
])
def test_an_unwritable_output_is_one_line_and_leaves_nothing(tmp_path, frame, target, reason):
    """Guards against write_table raising IsADirectoryError/FileNotFoundError and leaving `.NAME.tmp` behind."""
    (tmp_path / "folder").mkdir()
    path = tmp_path / target
    one_line_error(lambda: write_table(frame, path, "csv"), f"cannot write {path}: {reason}")
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "folder") == []


def test_unwritable_places_and_empty_paths_are_one_line(frame):
    """Guards against raw OSError/ValueError from write_table for /proc and for an empty path."""
    one_line_error(lambda: write_table(frame, "", "json"), "cannot write '': no file name")
    one_line_error(lambda: write_table(frame, Path(""), "json"), r"cannot write \.: Is a directory")
    if Path("/proc/self").is_dir():
        one_line_error(lambda: write_table(frame, "/proc/x.json", "json"), "cannot write /proc/x.json: ")


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_full_disk_keeps_the_old_table_and_removes_the_temporary(tmp_path, frame, fmt, monkeypatch):
    """Guards against ENOSPC mid-write leaving a half-written temporary file and a raw OSError."""
    path = tmp_path / f"t.{fmt}"
    path.write_text("the old table")

    def full(self, f, **kwargs):
        f.write("half a ta")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pd.DataFrame, f"to_{fmt}", full)
    one_line_error(lambda: write_table(frame, path, fmt), f"cannot write {path}: No space left on device")
    assert path.read_text() == "the old table" and leftovers(tmp_path) == []

    def interrupted(self, f, **kwargs):
        f.write("half a ta")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, f"to_{fmt}", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_table(frame, path, fmt)
    assert path.read_text() == "the old table" and leftovers(tmp_path) == []


def test_parquet_without_pyarrow_is_one_line_and_leaves_nothing(tmp_path, frame, monkeypatch):
    """Guards against a missing parquet engine leaving the opened temporary file behind."""
    def no_engine(self, f, **kwargs):
        raise ImportError("Unable to find a usable engine;\ntried using: 'pyarrow', 'fastparquet'.")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", no_engine)
    one_line_error(lambda: write_table(frame, tmp_path / "t.parquet", "parquet"), "parquet output needs pyarrow")
    assert list(tmp_path.iterdir()) == []


def test_writing_over_the_source_is_refused(tmp_path, frame):
    """Guards against `best --storage X -o X` replacing the table, or the store, it reads."""
    table = tmp_path / "t.csv"
    write_table(frame, table, "csv")
    (tmp_path / "link.csv").symlink_to(table)
    store = tmp_path / "s.sqlite"
    shutil.copyfile(STORE, store)
    assert same_file(table, table) and same_file(str(table), tmp_path / "link.csv")
    assert same_file(f"sqlite:///{store}", store) and same_file(store, f"sqlite:///{store}")
    assert not same_file(table, tmp_path / "new.csv") and not same_file(tmp_path / "none.csv", tmp_path / "none.csv")
    assert not same_file("postgresql+psycopg://u@h/db", table)
    before = store.read_bytes()
    for source in (f"sqlite:///{store}", store):
        one_line_error(lambda: write_table(frame, store, "csv", source=source),
                       f"cannot write {store}: it is the table's source")
    one_line_error(lambda: write_table(frame, tmp_path / "link.csv", "json", source=table), "the table's source")
    assert store.read_bytes() == before and load_best(table)["kernel"].tolist() == frame["kernel"].tolist()
    write_table(frame, tmp_path / "other.csv", "csv", source=table)  # elsewhere is fine
    assert leftovers(tmp_path) == []


def test_a_bundle_stands_for_its_table_file(tmp_path):
    """Guards against same_file missing that `-o BUNDLE/best.json` overwrites the bundle's table."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    (bundle / "best.json").write_text("[]")
    assert same_file(bundle, bundle / "best.json") and not same_file(bundle, tmp_path / "best.json")
