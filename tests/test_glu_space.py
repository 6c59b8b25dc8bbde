"""benchmarks/glu_space.py: the GLU sweep's space with the problems `shapes --device cuda` recorded
(their routers' histograms) and the kernels of benchmarks/configs/moe_glu_bf16.yaml."""

import importlib.util
from pathlib import Path

import pytest

from cutlass_tune.space import load_space

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "glu_space.py"

CAPTURED = """\
problems:
  - {experts: 4, n: 64, k: 64, rows: 40, routing: {histogram: [20, 10, 0, 10]}, epilogue: silu+glu}
dtypes: [bf16]
layouts: [tn]
kernels: {epilogue_schedule: [no_smem], epilogue_source: [false]}
"""


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("glu_space", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_captured_problems_take_the_base_space_s_kernels(script, tmp_path, capsys):
    captured = tmp_path / "cap-x_bf16_tn_grouped_glu.yaml"
    captured.write_text(CAPTURED)
    out = tmp_path / "glu.yaml"
    assert script.main([str(out), str(captured)]) == 0
    space, base = load_space(out), load_space(script.BASE)
    assert [p.group_rows for p in space.problems] == [(20, 10, 0, 10)]  # the router's counts, not uniform
    assert [p.epilogue.name for p in space.problems] == ["silu+glu"]
    assert {c.name for c in space.valid} == {c.name for c in base.valid} and len(space.valid) == 11  # the kernels
    assert "1 captured GLU problems" in capsys.readouterr().out


def test_a_missing_or_empty_capture_is_one_line_and_exit_2(script, tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("problems: []\n")
    assert script.main([str(tmp_path / "out.yaml"), str(empty)]) == 2
    assert script.main([str(tmp_path / "out.yaml"), str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"glu_space: {empty}: no problems" and err[1].startswith("glu_space: [Errno 2]")
    assert not (tmp_path / "out.yaml").exists()


GROUPED = """\
problems:
  - {experts: 4, n: 64, k: 32, rows: 40, routing: {histogram: [20, 10, 0, 10]}}
  - {experts: 4, n: 32, k: 32, rows: 40, routing: {histogram: [20, 10, 0, 10]}}
dtypes: [bf16]
layouts: [tn]
"""


def test_the_gate_up_of_a_plain_grouped_capture_becomes_its_glu_problem(script, tmp_path):
    """torch's "grouped_mm" experts pose plain grouped problems: gate_up (N 2I = 64, K H = 32) and
    down (N H = 32, K I = 32); the gate_up is swept as the GLU problem with its routing."""
    captured = tmp_path / "cap-x_bf16_tn_grouped.yaml"
    captured.write_text(GROUPED)
    out = tmp_path / "glu.yaml"
    assert script.main([str(out), str(captured)]) == 0
    space = load_space(out)
    found = [(p.n, p.k, p.group_rows, p.epilogue.name) for p in space.problems]
    assert found == [(64, 32, (20, 10, 0, 10), "silu+glu")]
    alone = tmp_path / "cap-y_bf16_tn_grouped.yaml"
    alone.write_text(GROUPED.replace("n: 32, k: 32", "n: 48, k: 32"))  # no down problem of this gate_up
    assert script.main([str(tmp_path / "none.yaml"), str(alone)]) == 2
