"""Best-config tables carry each row's epilogue and fp8 scaling: files round-trip them, older
files read as plain GEMMs, and a lookup matches both exactly."""

import json
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.report import write_table
from cutlass_tune.runtime import BestTable
from cutlass_tune.space import Activation, DType, Epilogue, KernelConfig, Scaling
from cutlass_tune.tables import COLUMNS, BestTableError, read_table

DATA = Path(__file__).resolve().parents[1] / "report" / "data"


def _rows(*operations):
    """One row of tests/report/data/best-v2.csv per (epilogue, scaling, dtype), as `load_best`
    writes them, its config and name made to match."""
    template = read_table(DATA / "best-v2.csv").iloc[0]
    rows = []
    for epilogue, scaling, dtype in operations:
        cfg = KernelConfig.from_dict(json.loads(template["config"]))
        out = DType.BF16
        cfg = KernelConfig.from_dict({**cfg.to_dict(), "dtype_a": dtype, "dtype_b": dtype, "dtype_c": out.value,
                                      "dtype_d": out.value, "epilogue": epilogue, "scaling": scaling,
                                      "tile_k": 128 if dtype == "e4m3" else 64})
        suffix = (f"_{epilogue}" if epilogue != "none" else "") + (f"_scale-{scaling}" if scaling != "none" else "")
        rows.append({**template.to_dict(), "problem": f"{template['m']}x{template['n']}x{template['k']}_"
                     f"{dtype}{dtype}bf16_tn{suffix}", "dtype_a": dtype, "dtype_b": dtype, "kernel": cfg.name,
                     "config_hash": cfg.hash, "config": json.dumps(cfg.to_dict(), sort_keys=True),
                     "tile_k": cfg.tile_k, "epilogue": epilogue, "scaling": scaling,
                     "torch_compile_tflops": 600.0 if epilogue != "none" else float("nan"),
                     "torch_compile_ratio": template["tflops"] / 600.0 if epilogue != "none" else float("nan")})
    return pd.DataFrame(rows)[list(COLUMNS)]


OPERATIONS = [("none", "none", "bf16"), ("bias+silu", "none", "bf16"), ("bias+gelu", "none", "bf16"),
              ("none", "rowcol", "e4m3")]


def test_a_table_written_before_fused_epilogues_reads_as_plain_gemms():
    table = read_table(DATA / "best-v2.csv")
    assert set(COLUMNS) <= set(table.columns)
    assert (table["epilogue"] == "none").all() and (table["scaling"] == "none").all()
    assert table["torch_compile_ratio"].isna().all()
    first = table.iloc[0]
    match = BestTable(table).lookup(first.m, first.n, first.k)
    assert match.exact and match.config.epilogue == Epilogue()
    with pytest.raises(BestTableError, match="no tuned problem for bf16 tn bias\\+silu"):
        BestTable(table).lookup(first.m, first.n, first.k, epilogue="bias+silu")


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_epilogue_and_scaling_columns_round_trip(tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    frame = _rows(*OPERATIONS)
    write_table(frame, tmp_path / f"best.{fmt}", fmt)
    again = read_table(tmp_path / f"best.{fmt}")
    assert list(again["epilogue"]) == [e for e, _, _ in OPERATIONS]
    assert list(again["scaling"]) == [s for _, s, _ in OPERATIONS]
    assert again["torch_compile_ratio"].iloc[1] == pytest.approx(frame["torch_compile_ratio"].iloc[1])
    assert pd.isna(again["torch_compile_ratio"].iloc[0])


def test_a_lookup_matches_epilogue_and_scaling_exactly():
    frame = _rows(*OPERATIONS)
    table = BestTable(frame)
    m, n, k = (int(frame.iloc[0][c]) for c in "mnk")
    assert table.lookup(m, n, k).row["epilogue"] == "none"  # the plain row, though others share the shape
    silu = table.lookup(m, n, k, epilogue="bias+silu")
    assert silu.exact and silu.config.epilogue == Epilogue(bias=True, activation=Activation.SILU)
    assert table.lookup(m, n, k, epilogue=Epilogue(True, Activation.GELU)).row["epilogue"] == "bias+gelu"
    assert table.lookup(m * 2, n, k, epilogue="bias+gelu").row["epilogue"] == "bias+gelu"  # nearest, same epilogue
    fp8 = table.lookup(m, n, k, "e4m3", scaling=Scaling.ROWCOL)
    assert fp8.config.scaling is Scaling.ROWCOL
    with pytest.raises(BestTableError, match=r"no tuned problem for bf16 tn silu \(the table has: .*bf16 -> bf16 tn "
                                             r"bias\+silu"):
        table.lookup(m, n, k, epilogue="silu")  # silu without bias is another kernel
    with pytest.raises(BestTableError, match="no tuned problem for e4m3 tn scale-tensor"):
        table.lookup(m, n, k, "e4m3", scaling="tensor")
    with pytest.raises(BestTableError, match="no tuned problem for e4m3 tn"):
        table.lookup(m, n, k, "e4m3")  # unit scales: not the rowcol kernel
    only_fused = BestTable(frame[frame["epilogue"] != "none"])
    with pytest.raises(BestTableError, match="no tuned problem for bf16 tn \\("):
        only_fused.lookup(m, n, k)  # a fused row never answers a plain call
    with pytest.raises(BestTableError, match="write it as 'bias\\+silu'"):
        table.lookup(m, n, k, epilogue="silu+bias")
    with pytest.raises(BestTableError, match="scaling 'row' is not one of none, tensor, rowcol"):
        table.lookup(m, n, k, scaling="row")


def test_a_frame_without_the_columns_is_plain():
    frame = _rows(("none", "none", "bf16")).drop(columns=["epilogue", "scaling"])
    table = BestTable(frame)
    assert table.lookup(*(int(frame.iloc[0][c]) for c in "mnk")).exact


@pytest.mark.parametrize(("column", "value", "message"), [
    ("epilogue", "silu+bias", "epilogue 'silu\\+bias' is not an epilogue"),
    ("epilogue", "bias+swish", "epilogue 'bias\\+swish' is not an epilogue"),
    ("scaling", "row", "scaling 'row' is not one of none, tensor, rowcol"),
    ("epilogue", "bias", "epilogue 'bias' is not its config's 'bias\\+silu'"),
    ("scaling", "tensor", "scaling 'tensor' is not its config's 'none'"),
])
def test_bad_operation_cells_are_one_line_errors_naming_row_and_column(tmp_path, column, value, message):
    # Guards against a row whose epilogue is not its kernel's: matmul would pick it by the one
    # and run the other (a bias+silu call answered without the bias, or the reverse).
    frame = _rows(("none", "none", "bf16"), ("bias+silu", "none", "bf16"))
    frame.loc[1, column] = value
    frame.to_csv(tmp_path / "best.csv", index=False)
    with pytest.raises(BestTableError, match=f"best.csv: row 2 \\(.*\\): {message}") as err:
        read_table(tmp_path / "best.csv")
    assert "\n" not in str(err.value)


def test_a_table_written_before_the_strongest_baseline_reads_with_its_ratio_s_baseline(tmp_path):
    frame = _rows(("none", "none", "bf16"), ("bias+gelu_tanh", "none", "bf16"))
    old = frame.drop(columns=["cublaslt_tflops", "cublaslt_ratio", "strongest", "strongest_tflops", "strongest_ratio"])
    old.to_csv(tmp_path / "old.csv", index=False)
    again = read_table(tmp_path / "old.csv")
    assert list(again["strongest"]) == ["cuBLAS", "torch eager"]
    assert list(again["strongest_ratio"]) == pytest.approx(list(frame["ratio"]))
    assert again["cublaslt_ratio"].isna().all()
    bad = frame.assign(strongest="torch dense")  # a ceiling, never a path to win against
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(BestTableError, match="strongest"):
        read_table(tmp_path / "bad.csv")
