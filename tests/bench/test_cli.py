import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
NO_GPU = "error: no CUDA GPU is visible; `cutlass-tune compile CONFIG` builds kernels without one\n"


def cutlass_tune(*args):
    exe = shutil.which("cutlass-tune")
    cmd = [exe] if exe else [sys.executable, "-m", "cutlass_tune.cli"]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, cwd=REPO)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
@pytest.mark.parametrize("extra", [[], ["--gpu", "1", "--repeat", "2"]])
def test_bench_without_a_gpu_is_one_line_and_exit_2(tmp_path, extra):
    r = cutlass_tune("bench", "configs/quick.yaml", "--output", tmp_path / "out.jsonl", *extra)
    assert (r.returncode, r.stderr, r.stdout) == (2, NO_GPU, "")
    assert not (tmp_path / "out.jsonl").exists()


def test_bench_rejects_a_misaligned_problem_before_looking_for_a_gpu(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("problems: {m: 1024, n: 1024, k: 1020}\n")
    r = cutlass_tune("bench", config)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "K=1020 is not a multiple of 8: TMA needs" in r.stderr
