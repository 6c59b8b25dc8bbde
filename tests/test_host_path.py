"""benchmarks/host_path.py on a CPU host: the rows it builds, the skips it names, and one run of
its workers end to end (the CUDA figures come from benchmarks/gpu_moe_layer.sh)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "host_path.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("host_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_path"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["host_path"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU mode")
def test_cpu_rows_run_where_a_cpu_kernel_exists_and_name_why_not_elsewhere(script):
    rows = script.Builder([], script.SIZES["tiny"], "cpu").rows(["eager-no_grad", "direct"])
    by_name = {(r.operator, r.mode): r for r in rows}
    for operator in ("mm", "linear bias", "linear bias+relu", "grouped_mm"):
        row = by_name[(operator, "eager-no_grad")]
        assert not row.skip and row.relative_error == pytest.approx(0.0, abs=1e-2)  # both run torch's math here
        assert script.block_us(row.ours_call, 2, cuda=False) > 0
    assert "CUDA" in by_name[("matmul (door)", "direct")].skip  # the direct doors take CUDA tensors only
    assert by_name[("fp8 row-wise (door)", "direct")].skip == "needs CUDA (fp8 GEMMs)"
    assert by_name[("matmul (door)", "direct")].ours_call is None


def test_a_row_whose_signature_an_earlier_row_resolved_still_finds_its_table(script):
    """Guards the row label: the grouped door shares the grouped operator's plan signature, and a
    fallback cached by the operator's row kept the door's pick silent on a table without its kernel."""
    import warnings

    import pandas as pd

    from cutlass_tune.runtime import BestTable

    builder = script.Builder([], script.SIZES["tiny"], "cpu")
    empty, tuned = (BestTable(pd.DataFrame({"m": [1], "n": [1], "k": [1]})) for _ in range(2))
    builder.tables, builder.keys = [("empty", empty), ("tuned", tuned)], ["host-path-0", "host-path-1"]

    def ours(table, key):  # a fallback warns when its plan is resolved, and is cached silently after
        if table.plans.get(("sig",)) is None:
            table.plans.put(("sig",), "ready")
            if table is empty:
                warnings.warn("cutlass_tune: no row; using torch", RuntimeWarning, stacklevel=1)
        return lambda x: x

    picked = [builder.row(name, "direct", lambda x: x, ours, (torch.ones(2),)).table
              for name in ("grouped_mm", "grouped_mm (door)")]
    assert picked == ["tuned", "tuned"]


def test_a_worker_without_the_native_module_is_one_python_path(script):
    head = {"native": {"module": False, "active": False}}
    assert script.path_name("on", head) == "python"
    assert script.path_name("off", {"native": {"module": True, "active": False}}) == "python (native off)"
    assert script.path_name("on", {"native": {"module": True, "active": True}}) == "native"


def test_the_summary_takes_medians_and_the_ratio_of_torch_to_ours(script):
    head = {"device": "cpu", "torch": "x", "native": {"module": True, "active": True},
            "rows": [{"operator": "mm", "mode": "eager-no_grad", "skip": "", "table": "t.csv", "fallbacks": [],
                      "relative_error": 0.0},
                     {"operator": "fp8", "mode": "direct", "skip": "needs CUDA", "table": "", "fallbacks": [],
                      "relative_error": None}]}
    run = {"heads": {"on": head}, "blocks": {"on": [{"torch": [10.0, 30.0, 20.0], "ours": [5.0, 40.0, 10.0]},
                                                    {"torch": [], "ours": []}]}}
    mm, fp8 = script.summarize(run)
    assert (mm["torch_us"], mm["ours_us"], mm["torch_over_ours"], mm["path"]) == (20.0, 10.0, 2.0, "native")
    # each round's own ratio (2.0, 0.75, 2.0): a slow round on both sides does not move it
    assert mm["paired"] == 2.0 and mm["paired_spread"][0] < 1.0
    assert fp8["torch_over_ours"] is None and fp8["paired"] is None
    text = script.markdown([mm, fp8], {"device": "cpu", "torch": "x", "reps": 3, "calls": 1})
    assert "| mm | eager-no_grad | native | 20.0 | 10.0 | 2.000 | 2.000 (" in text and "skipped: needs CUDA" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU mode")
def test_the_cpu_mode_runs_end_to_end(script, tmp_path, capsys):
    assert script.main([str(tmp_path), "--modes", "eager-no_grad", "--calls", "2", "--reps", "2",
                        "--native", "on"]) == 0
    result = json.loads((tmp_path / "host_path.json").read_text())
    timed = [r for r in result["rows"] if not r["skip"]]
    assert {r["operator"] for r in timed} == {"mm", "linear bias", "linear bias+gelu", "linear bias+relu", "grouped_mm",
                                             "scaled_mm (fp8 row-wise)"}
    assert all(len(b["torch"]) == 2 == len(b["ours"]) for b in result["blocks"]["on"])
    assert all(r["torch_us"] > 0 and r["ours_us"] > 0 for r in timed)
    assert (tmp_path / "host_path.md").read_text() in capsys.readouterr().out


def test_bad_arguments_exit_2(script, capsys):
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(["out", "--calls", "0"])
    assert exit_.value.code == 2 and "--calls" in capsys.readouterr().err
