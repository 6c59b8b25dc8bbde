"""benchmarks/fusion_model.py's pieces that run without a GPU or transformers: its arguments and
the summary table of its JSON files (the model cases run on the GPU, benchmarks/gpu_fusion_e2e.sh)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fusion_model.py"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(SCRIPT.parent))  # its helpers beside it, as when it runs as a script
    spec = importlib.util.spec_from_file_location("fusion_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fusion_model"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["fusion_model"]
    sys.path.remove(str(SCRIPT.parent))


def test_arguments_take_the_familys_widths_where_not_given(script, tmp_path):
    args = script.parse_args(["table.csv", str(tmp_path), "--family", "bert", "--mode", "infer-compile"])
    assert (args.layers, args.tokens, args.min_ratio) == (4, 16 * 512, 1.0)
    assert script.case_name(args) == "bert-8192-infer-compile"
    args = script.parse_args(["t", str(tmp_path), "--family", "llama", "--tokens", "1024", "--layers", "1"])
    assert (args.layers, args.tokens, script.case_name(args)) == (1, 1024, "llama-1024-infer")


@pytest.mark.parametrize("argv", [["--mode", "serve"], ["--family", "t5"], ["--family", "bert", "--tokens", "700"],
                                  ["--blocks", "0"]])
def test_bad_arguments_exit_2(script, tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(["t", str(tmp_path), *argv])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and last.startswith("fusion_model.py: error")


def result(family, mode, plain, fused, *, error=1e-3, grads=None, made=None):
    return {"family": family, "tokens": 4096, "layers": 2, "mode": mode, "median_ms": {"plain": plain, "fused": fused},
            "speedup": plain / fused, "relative_error": error, "close": error < 2e-2, "fallbacks": [],
            "grads_close": grads, "decisions": made or {"kind": "patch", "layers": 7, "swapped": 7, "fused": 1}}


def test_the_summary_has_a_line_per_case_and_skips_other_files(script, tmp_path, capsys):
    (tmp_path / "llama-4096-infer.json").write_text(json.dumps(result("llama", "infer", 10.0, 8.0)))
    compiled = result("llama", "infer-compile", 9.0, 9.5, error=0.5,
                      made={"kind": "inductor_options", "sites": 4, "fused": 3})
    (tmp_path / "llama-4096-infer-compile.json").write_text(json.dumps(compiled))
    (tmp_path / "llama-4096-train.json").write_text(json.dumps(result("llama", "train", 30.0, 30.0, grads=False)))
    (tmp_path / "cut-off.json").write_text('{"family": ')  # a case cut while writing
    (tmp_path / "gpu.json").write_text("[1, 2]")
    assert script.main(["summary", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].split()[:3] == ["family", "tokens", "mode"]
    assert lines[2].split() == ["llama", "4096", "infer", "1/7", "10.000", "8.000", "1.250", "1.0e-03", "ok", "-", "0"]
    assert lines[1].split()[2:] == ["infer-compile", "3/4", "9.000", "9.500", "0.947", "5.0e-01", "FAIL", "-", "0"]
    assert lines[3].split()[-2] == "FAIL"
