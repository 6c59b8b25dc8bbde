"""A table's regime and dispatch columns: read as empty from tables written before them, and kept
through every file format."""

import math
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.report import write_table
from cutlass_tune.tables import COLUMNS, DISPATCH_COLUMNS, REGIME_COLUMNS, BestTableError, read_table

OLD = Path(__file__).resolve().parents[1] / "report" / "data" / "best-v2.csv"


def test_a_table_from_before_regimes_reads_them_empty():
    table = read_table(OLD)
    for c in (*REGIME_COLUMNS, *DISPATCH_COLUMNS):
        assert c in COLUMNS
        values = set(table[c])
        assert values == {""} if c.endswith("_regime") else table[c].isna().all()


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_regime_and_dispatch_columns_round_trip(tmp_path, fmt):
    table = read_table(OLD)
    table["idle_gap_regime"] = "idle-gap:200us"
    table["idle_gap_ratio"], table["idle_gap_sm_mhz"], table["idle_gap_power_w"] = 1.105, 1980.0, 581.5
    table["call_site_ratio"], table["call_site_regime"] = 0.97, "sustained"
    path = tmp_path / f"t.{fmt}"
    write_table(table, path, fmt)
    back = read_table(path)
    assert set(back["idle_gap_regime"]) == {"idle-gap:200us"} and set(back["call_site_regime"]) == {"sustained"}
    assert back["idle_gap_ratio"].tolist() == pytest.approx([1.105] * len(back))
    assert back["idle_gap_power_w"].tolist() == pytest.approx([581.5] * len(back))
    assert back["call_site_ratio"].tolist() == pytest.approx([0.97] * len(back))
    assert all(math.isnan(v) for v in back["in_model_ratio"]) and set(back["interleaved_regime"]) == {""}


@pytest.mark.parametrize(("column", "value", "said"), [
    ("idle_gap_regime", "idle-gap:2ms", "a timing regime"),
    ("call_site_regime", "fast", "a timing regime"),
    ("idle_gap_ratio", "high", "a number"),
])
def test_a_bad_regime_cell_is_named(tmp_path, column, value, said):
    frame = pd.read_csv(OLD, dtype=str)
    frame[column] = value
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(BestTableError, match=f"{column}.*{said}"):
        read_table(path)
