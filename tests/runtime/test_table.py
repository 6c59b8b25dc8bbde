"""A best-config table and its matches as a reader at a prompt meets them: short reprs, and the
dtype spellings the lookup's error lists all accepted."""

import pytest

from cutlass_tune.runtime import BestTable
from cutlass_tune.tables import BestTableError

from .tables import csv_table


@pytest.fixture()
def table(tmp_path) -> BestTable:
    return csv_table(tmp_path / "t.csv", [("bf16", "tn", 4096, 4096, 4096), ("f16", "nt", 1024, 2048, 512)])


def test_a_table_s_repr_names_its_source_rows_gpus_and_operations(table, tmp_path):
    # Regression: repr(BestTable) was the default <object at 0x...>, which told a reader nothing.
    text = repr(table)
    assert text == (f"BestTable(source={str(tmp_path / 't.csv')!r}, rows=2, gpus={table.gpus}, "
                    "operations=[bf16bf16bf16_tn, f16f16f16_nt])")
    assert repr(BestTable(table.frame)).startswith("BestTable(source=None, rows=2,")


def test_a_match_s_repr_is_one_short_line(table):
    # Regression: repr(Match) dumped its 90-column row (4,425 characters).
    match = table.lookup(4096, 4096, 4096)
    text = repr(match)
    assert "\n" not in text and len(text) < 300
    assert text == (f"Match(problem='4096x4096x4096_bf16bf16bf16_tn', kernel={match.row['kernel']!r}, "
                    f"ratio={match.ratio:.3f}, exact=True)")


@pytest.mark.parametrize("dtype", ["bfloat16", "torch.bfloat16", "bf16"])
def test_a_lookup_takes_the_torch_names_its_error_lists(table, dtype):
    # Regression: lookup(dtype="bfloat16") was refused by an error that listed bfloat16 as accepted.
    assert table.lookup(4096, 4096, 4096, dtype=dtype).exact
    assert table.lookup(1024, 2048, 512, dtype="float16", layout="nt", out_dtype="torch.float16").exact


def test_a_dtype_the_tables_lack_is_still_refused_in_one_line(table):
    with pytest.raises(BestTableError, match=r"dtype 'int8' is not a dtype of the tables \(.*bfloat16"):
        table.lookup(4096, 4096, 4096, dtype="int8")
