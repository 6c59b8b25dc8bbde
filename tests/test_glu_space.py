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
