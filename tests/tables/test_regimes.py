"""A table's regime and dispatch columns: read as empty from tables written before them, and kept
through every file format."""

import math
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.report import write_table
from cutlass_tune.runtime import BestTable
from cutlass_tune.tables import COLUMNS, DISPATCH_COLUMNS, REGIME_COLUMNS, BestTableError, read_table, regime_text

OLD = Path(__file__).resolve().parents[1] / "report" / "data" / "best-v2.csv"
TUNED_BEFORE = Path(__file__).resolve().parent / "data" / "tuned-before-in-model-regime.csv"


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
    table["in_model_regime"], table["in_model_ratio"] = "in-model:compiled:4096", 1.12
    table["in_model_sm_mhz"], table["in_model_power_w"] = 1755.0, 610.0
    path = tmp_path / f"t.{fmt}"
    write_table(table, path, fmt)
    back = read_table(path)
    assert set(back["idle_gap_regime"]) == {"idle-gap:200us"} and set(back["call_site_regime"]) == {"sustained"}
    assert back["idle_gap_ratio"].tolist() == pytest.approx([1.105] * len(back))
    assert back["idle_gap_power_w"].tolist() == pytest.approx([581.5] * len(back))
    assert back["call_site_ratio"].tolist() == pytest.approx([0.97] * len(back))
    assert set(back["in_model_regime"]) == {"in-model:compiled:4096"} and set(back["interleaved_regime"]) == {""}
    assert back["in_model_ratio"].tolist() == pytest.approx([1.12] * len(back))
    assert back["in_model_sm_mhz"].tolist() == pytest.approx([1755.0] * len(back))
    assert regime_text(back.iloc[0]) == ("idle-gap:200us 1.105 at 1980 MHz 582 W; in-model:compiled:4096 1.120 at "
                                         "1755 MHz 610 W; call site 0.970 (sustained)")


def test_in_model_ratio_is_the_in_model_regimes_ratio_column_once():
    assert "in_model_ratio" in REGIME_COLUMNS and "in_model_ratio" not in DISPATCH_COLUMNS
    assert COLUMNS.count("in_model_ratio") == 1
    assert {"in_model_regime", "in_model_sm_mhz", "in_model_power_w"} <= set(COLUMNS)


def test_a_table_tune_model_wrote_before_the_in_model_regime_still_loads_and_dispatches():
    """Guards the tables `tune-model --out` wrote with `in_model_ratio` alone (no regime, clock or power)."""
    table = read_table(TUNED_BEFORE)
    assert table["in_model_ratio"].tolist()[:2] == pytest.approx([1.25, 0.95])
    assert math.isnan(table["in_model_ratio"].iloc[2])
    assert set(table["in_model_regime"]) == {""} and table["in_model_sm_mhz"].isna().all()
    assert regime_text(table.iloc[0]) == "in the model 1.250" and regime_text(table.iloc[2]) == ""
    rows = BestTable.load(TUNED_BEFORE).frame
    first = BestTable(rows).lookup(int(rows.iloc[0]["m"]), int(rows.iloc[0]["n"]), int(rows.iloc[0]["k"]))
    ratio, source = first.dispatch_ratio()
    assert ratio == pytest.approx(1.25) and source.startswith(" inside the model (its claim")


@pytest.mark.parametrize(("column", "value", "said"), [
    ("idle_gap_regime", "idle-gap:2ms", "a timing regime"),
    ("call_site_regime", "fast", "a timing regime"),
    ("idle_gap_ratio", "high", "a number"),
    ("in_model_regime", "in-model:fast", "a timing regime"),
    ("in_model_sm_mhz", "fast", "a number"),
])
def test_a_bad_regime_cell_is_named(tmp_path, column, value, said):
    frame = pd.read_csv(OLD, dtype=str)
    frame[column] = value
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(BestTableError, match=f"{column}.*{said}"):
        read_table(path)
