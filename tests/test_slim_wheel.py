"""benchmarks/slim_wheel.py: what a cut wheel keeps (the GPU scripts carry transformers and
CUTLASS cut by it inside the 64 MiB working tree)."""

import importlib.util
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "slim_wheel.py"
spec = importlib.util.spec_from_file_location("slim_wheel", SCRIPT)
slim_wheel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slim_wheel)

FILES = ["transformers/__init__.py", "transformers/models/__init__.py", "transformers/models/auto/config.py",
         "transformers/models/qwen3_moe/modeling.py", "transformers/models/llama/modeling.py",
         "transformers/models/gpt_oss/modeling.py", "lib/source/include/cute/a.hpp",
         "lib/source/tools/util/include/u.h", "lib/source/tools/profiler/p.cu", "lib/source/examples/e.cu",
         "pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD"]


@pytest.fixture
def wheel(tmp_path):
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name in FILES:
            z.writestr(name, f"contents of {name}")
    return path


def _names(path):
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def test_models_keeps_the_named_folders_auto_and_everything_outside_models(wheel, tmp_path):
    got = _names(slim_wheel.slim(wheel, tmp_path / "out", models=("qwen3_moe",)))
    assert set(got) == set(FILES) - {"transformers/models/llama/modeling.py", "transformers/models/gpt_oss/modeling.py"}
    assert got["transformers/models/qwen3_moe/modeling.py"] == b"contents of transformers/models/qwen3_moe/modeling.py"
    assert got["pkg-1.0.dist-info/RECORD"] == b""  # its hashes would name files left out


def test_drop_leaves_out_prefixes_but_what_keep_names(wheel, tmp_path):
    got = _names(slim_wheel.slim(wheel, tmp_path / "out", drop=("lib/source/examples/", "lib/source/tools/"),
                                 keep=("lib/source/tools/util/include/",)))
    assert set(got) == set(FILES) - {"lib/source/tools/profiler/p.cu", "lib/source/examples/e.cu"}


def test_drop_compiled_leaves_out_only_extensions_with_their_python_source(tmp_path):
    """SQLAlchemy imports its pure-Python module where its Cython build is missing: that build goes,
    an extension without a source (the only code of its module) stays."""
    path = tmp_path / "sa-1.0-cp312-cp312-linux_x86_64.whl"
    names = ["sa/_row_cy.py", "sa/_row_cy.cpython-312-x86_64-linux-gnu.so", "sa/_only.cpython-312-x86_64-linux-gnu.so"]
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(name, name)
    got = _names(slim_wheel.slim(path, tmp_path / "out", compiled=True))
    assert set(got) == {"sa/_row_cy.py", "sa/_only.cpython-312-x86_64-linux-gnu.so"}


@pytest.mark.parametrize(("options", "message"), [
    ({"models": ("qwen3_moe", "nope")}, "has no model folders nope"),
    ({"drop": ("misspelt/",)}, "the options leave nothing out"),
])
def test_a_cut_that_names_nothing_real_is_refused(wheel, tmp_path, options, message):
    with pytest.raises(SystemExit, match=message):
        slim_wheel.slim(wheel, tmp_path / "out", **options)
    assert not (tmp_path / "out" / wheel.name).exists()  # nothing half-written


def test_the_output_never_overwrites_its_source(wheel):
    with pytest.raises(SystemExit, match="overwrite its source"):
        slim_wheel.slim(wheel, wheel.parent, models=("qwen3_moe",))
