"""Stages import downward only: the runtime without the tuner, the tuner's stages without torch
(tests/test_cli.py checks the commands). Each check runs in a fresh interpreter and looks at
what it loaded."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STORE = REPO / "results" / "sweep-nvidia-h200.sqlite"


def loaded(code: str, *watched: str) -> list[str]:
    """Which of `watched` (top-level modules or packages) running `code` imports."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps(sorted(w for w in {list(watched)!r} if any("
             "m == w or m.startswith(w + '.') for m in sys.modules))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_runtime_imports_none_of_the_tuner():
    # Guards a serving host against needing the store's, the search's or the dashboard's dependencies.
    every_name = "import cutlass_tune.runtime as r\nfor name in r.__all__:\n    getattr(r, name)"
    assert loaded(every_name, "optuna", "sqlalchemy", "plotly", "cutlass_tune.search",
                  "cutlass_tune.store", "cutlass_tune.report", "cutlass_tune.bench") == []


def test_a_table_file_loads_without_the_tuner(tmp_path):
    table = tmp_path / "best.csv"
    subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--storage", STORE, "-o", table,
                    "--format", "csv"], check=True, capture_output=True, cwd=REPO)
    code = f"from cutlass_tune.runtime import BestTable\nBestTable.load({str(table)!r})"
    assert loaded(code, "optuna", "sqlalchemy", "cutlass_tune.store", "cutlass_tune.report") == []


def test_the_tuner_stages_import_no_torch():
    stages = "import cutlass_tune, cutlass_tune.store, cutlass_tune.search, cutlass_tune.report, cutlass_tune.tables"
    assert loaded(stages, "torch") == []


COMPILER = ("cutlass_tune.compile", "cutlass_tune.render", "jinja2", "filelock")
"""What building a kernel takes: the nvcc driver and toolchain, the renderer and their libraries."""


def test_loading_kernels_imports_neither_the_compiler_nor_torch():
    assert loaded("import cutlass_tune.kernel", *COMPILER, "torch", "pandas", "cutlass_tune.runtime") == []


def test_a_bundle_loads_without_the_compiler(tmp_path):
    # Guards a serving host without a CUDA toolkit: only a kernel no bundle holds is compiled.
    from cutlass_tune.report import load_best, write_bundle

    from .report.test_bundle import BUILT_WITH, stand_ins

    frame = load_best(STORE)
    write_bundle(frame, stand_ins(frame, tmp_path / "cache"), tmp_path / "bundle", BUILT_WITH)
    code = ("import cutlass_tune.runtime as r\nfor name in r.__all__:\n    getattr(r, name)\n"
            f"table = r.BestTable.load({str(tmp_path / 'bundle')!r})\nassert table.bundled")
    assert loaded(code, *COMPILER) == []


def test_dir_lists_the_lazily_imported_public_names():
    # Guards dir()/tab completion against showing nothing public behind the lazy __getattr__.
    probe = ("import cutlass_tune, cutlass_tune.runtime as r\n"
             "public = {'BestTable', 'Gemm', 'grouped_mm', 'matmul', 'patch', 'register_table', 'load_best', 'nn'}\n"
             "assert public <= set(cutlass_tune.__all__) <= set(dir(cutlass_tune)), dir(cutlass_tune)\n"
             "assert set(r.__all__) <= set(dir(r)), dir(r)")
    assert loaded(probe, "torch") == []  # listing the names imports none of them
    assert loaded("import cutlass_tune\nfor n in cutlass_tune.__all__:\n    getattr(cutlass_tune, n)", "torch")


def test_a_lazily_imported_name_is_kept_in_its_package_once_served():
    # Guards the doors' host time: `cutlass_tune.matmul` ran the package's __getattr__ (an import
    # statement, microseconds) on every call of the door.
    probe = ("import cutlass_tune, cutlass_tune.runtime as r\n"
             "assert 'matmul' not in vars(cutlass_tune) and 'grouped_mm' not in vars(r)\n"
             "from cutlass_tune.runtime import _grouped, _matmul\n"
             "assert cutlass_tune.matmul is _matmul.matmul and r.grouped_mm is _grouped.grouped_mm\n"
             "assert vars(cutlass_tune)['matmul'] is _matmul.matmul and vars(r)['grouped_mm'] is _grouped.grouped_mm\n"
             "assert vars(r)['matmul'] is _matmul.matmul  # served to the package above, by the runtime's")
    assert loaded(probe, "torch") == ["torch"]
