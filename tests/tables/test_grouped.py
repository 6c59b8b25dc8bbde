"""Best-config tables carry grouped problems (MoE experts): grouping, groups and routing beside
m = the routed rows; older tables read as single GEMMs; a grouped lookup matches the operation
and the experts, N and K exactly and picks the nearest routed rows."""

from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.report import write_table
from cutlass_tune.runtime import BestTable
from cutlass_tune.space import DType, Grouping, Layout, Operation
from cutlass_tune.tables import BestTableError, read_table
from tests.runtime.tables import grouped_rows

DATA = Path(__file__).resolve().parents[1] / "report" / "data"
TN = Operation(grouping=Grouping.GROUPED)
TT = Operation(grouping=Grouping.GROUPED, layout_b=Layout.ROW)


def test_a_table_written_before_grouped_gemms_reads_as_single_gemms():
    table = read_table(DATA / "best-v2.csv")
    assert (table["grouping"] == "none").all() and (table["groups"] == 0).all()
    assert (table["routing"] == "none").all()


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_grouped_columns_round_trip(tmp_path, fmt):
    frame = grouped_rows([("bf16", "tn", 8, 64, 64, 32), ("bf16", "tt", 8, 64, 32, 32)], routing="zipf")
    write_table(frame, tmp_path / f"best.{fmt}", fmt)
    back = read_table(tmp_path / f"best.{fmt}")
    assert back[["grouping", "groups", "routing"]].values.tolist() == [["grouped", 8, "zipf"]] * 2
    assert back["groups"].dtype == "int64"


@pytest.mark.parametrize(("column", "value", "message"), [
    ("groups", 0, "a grouped row needs groups >= 1"),
    ("routing", "none", "a grouped row needs groups >= 1 and a routing"),
    ("routing", "poisson", "routing 'poisson' is not one of none, uniform, zipf, histogram"),
    ("groups", -1, "groups -1 is not a whole number from 0 to 4096"),
    ("grouping", "none", "grouping 'none' is not its config's 'grouped'"),
])
def test_bad_experts_cells_are_one_line_errors(tmp_path, column, value, message):
    frame = grouped_rows([("bf16", "tn", 8, 64, 64, 32)]).assign(**{column: value})
    frame.to_csv(tmp_path / "best.csv", index=False)
    with pytest.raises(BestTableError, match=message) as err:
        read_table(tmp_path / "best.csv")
    assert "\n" not in str(err.value)


def test_a_single_gemm_row_with_experts_is_refused(tmp_path):
    frame = read_table(DATA / "best-v2.csv").head(1).assign(groups=8)
    frame.to_csv(tmp_path / "best.csv", index=False)
    with pytest.raises(BestTableError, match="a single GEMM has groups 0 and routing 'none'"):
        read_table(tmp_path / "best.csv")


def _table():
    return BestTable(grouped_rows([("bf16", "tn", 8, 64, 64, 1024), ("bf16", "tn", 8, 64, 64, 32768),
                                   ("bf16", "tn", 16, 64, 64, 4096), ("bf16", "tt", 8, 64, 64, 4096)]))


def test_grouped_lookup_takes_the_nearest_routed_rows_of_the_same_experts():
    table = _table()
    match = table.find(8192, 64, 64, TN, groups=8)  # log2 distance 2 to 32768, 3 to 1024
    assert (match.row["m"], match.row["groups"], match.exact, match.distance) == (32768, 8, False, 2.0)
    assert table.find(20000, 64, 64, TN, groups=8).row["m"] == 32768
    assert table.find(1500, 64, 64, TN, groups=8).row["m"] == 1024
    exact = table.find(4096, 64, 64, TT, groups=8)
    assert exact.exact and exact.row["layout"] == "tt" and exact.config.grouping is Grouping.GROUPED


def test_grouped_lookup_never_takes_other_experts_or_shapes():
    """Guards against a grouped call running a kernel tuned for other experts' N, K or count."""
    table = _table()
    for groups, n, k in ((4, 64, 64), (8, 128, 64), (8, 64, 128)):
        with pytest.raises(BestTableError, match=f"no tuned grouped problem of {groups} experts of {n}x{k}"):
            table.find(4096, n, k, TN, groups=groups)
    with pytest.raises(BestTableError, match="lookup: m '0' is not a positive whole number"):
        table.find(0, 64, 64, TN, groups=8)


def test_single_gemm_lookups_never_take_grouped_rows():
    table = BestTable(pd.concat([grouped_rows([("bf16", "tn", 8, 64, 64, 4096)]), read_table(DATA / "best-v2.csv")],
                                ignore_index=True))
    assert table.lookup(4096, 64, 64).row["grouping"] == "none"
    assert table.find(4096, 64, 64, Operation(dtype_a=DType.BF16)).row["grouping"] == "none"
    only_grouped = BestTable(grouped_rows([("bf16", "tn", 8, 64, 64, 4096)]))
    with pytest.raises(BestTableError, match="no tuned problem for bf16 tn"):
        only_grouped.lookup(4096, 64, 64)
