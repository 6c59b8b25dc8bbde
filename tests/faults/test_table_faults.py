"""Table files with values out of range: refused with the space files' rules, one line, exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune import load_best
from cutlass_tune.report import write_bundle
from cutlass_tune.tables import BestTableError, BundleError, read_bundle

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
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", *args, "--storage", str(path)],
                          capture_output=True, text=True, timeout=120)
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
    done = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--storage", str(bundle)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not its config's" in done.stderr
