"""Epilogues and fp8 scaling in space files, `--shapes` and `kernels: auto`."""

import os
import subprocess
import sys

import pytest

from cutlass_tune.errors import ConfigFileError
from cutlass_tune.space import (
    Activation,
    DType,
    Epilogue,
    EpilogueSchedule,
    KernelConfig,
    Problem,
    Scaling,
    check_config,
    load_space,
    space_for_shapes,
    sweep_space,
)

BIAS_GELU = Epilogue(bias=True, activation=Activation.GELU)


def write(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_problems_take_the_file_epilogue_or_their_own(tmp_path):
    sp = load_space(write(tmp_path, """
problems:
  - {m: 256, n: 256, k: 64, epilogue: [bias+silu, residual]}
  - {m: 512, n: 256, k: 64}
epilogue: gelu_tanh
kernels: {tile_m: 128, epilogue_schedule: [auto, no_smem]}
"""))
    assert [(p.m, p.epilogue.name) for p in sp.problems] == [
        (256, "bias+silu"), (256, "residual"), (512, "gelu_tanh")]
    # one config per kind of problem and knob value: the operation is fixed by the problem
    assert sorted((c.epilogue.name, c.epilogue_schedule.value) for c in sp.candidates) == [
        ("bias+silu", "no_smem"), ("bias+silu", "tma_cooperative"), ("gelu_tanh", "no_smem"),
        ("gelu_tanh", "tma_cooperative"), ("residual", "no_smem"), ("residual", "tma_cooperative")]
    # no_smem builds the residual's linear combination, not the fusions
    assert sorted(c.epilogue.name for c in sp.valid) == ["bias+silu", "gelu_tanh", "residual", "residual"]
    assert sp.census().invalid == {"fusion_schedule": 2}


def test_fp8_scaling_in_a_file(tmp_path):
    sp = load_space(write(tmp_path, """
problems: [{m: 256, n: 256, k: 256}]
dtypes: {input: e4m3, output: bf16}
scaling: rowcol
epilogue: bias
kernels: {tile_k: 128}
"""))
    (problem,) = sp.problems
    assert problem == Problem(256, 256, 256, dtype_a=DType.E4M3, dtype_b=DType.E4M3, dtype_d=DType.BF16,
                              epilogue=Epilogue(bias=True), scaling=Scaling.ROWCOL)
    (cfg,) = sp.valid
    assert cfg.scaling is Scaling.ROWCOL and cfg.epilogue == Epilogue(bias=True)


@pytest.mark.parametrize("text,key,message", [
    ("problems: [{m: 256, n: 256, k: 64, epilogue: bias+swish}]", "problems.0.epilogue.0", "unknown or repeated part"),
    ("problems: [{m: 256, n: 256, k: 64}]\nepilogue: silu+bias", "epilogue.0", "write it as 'bias+silu'"),
    ("problems: [{m: 256, n: 256, k: 64}]\nscaling: rows", "scaling.0", "'none', 'tensor', 'rowcol' or 'blockwise'"),
    ("problems: [{m: 256, n: 256, k: 64, scaling: rowcol}]", "problems", "scaling_inputs: fp8 scales"),
])
def test_bad_epilogue_or_scaling_is_one_line(tmp_path, text, key, message):
    with pytest.raises(ConfigFileError) as err:
        load_space(write(tmp_path, text))
    line = str(err.value)
    assert "\n" not in line and f": {key}" in line and message in line, line


def test_shapes_carry_epilogue_and_scaling_into_an_auto_space():
    # bias+gelu: the kind test_auto.py walks too (a walk is seconds, and the process keeps one per kind)
    sp = space_for_shapes("1024x4096x4096", dtype="e4m3", epilogue="bias+gelu", scaling="rowcol")
    (problem,) = sp.problems
    assert problem.epilogue == BIAS_GELU and problem.scaling is Scaling.ROWCOL
    (kind,) = sp.auto
    assert kind.operation.epilogue == BIAS_GELU and sp.auto_for(problem) is kind
    assert sp.auto_for(Problem(1024, 4096, 4096, dtype_a=DType.E4M3, dtype_b=DType.E4M3)) is None
    some = kind[: 50]
    assert all(c.epilogue == BIAS_GELU and c.scaling is Scaling.ROWCOL and not check_config(c) for c in some)
    # the fusion needs a TMA epilogue: auto never proposes no_smem for it
    assert EpilogueSchedule.NO_SMEM not in kind.values_in_valid()["epilogue_schedule"]


def test_a_residual_auto_space_keeps_its_c_operand():
    plain = space_for_shapes("4096x4096x4096").auto[0].values_in_valid()["epilogue_source"]
    residual = space_for_shapes("4096x4096x4096", epilogue="residual").auto[0].values_in_valid()
    assert set(plain) == {True, False} and residual["epilogue_source"] == (True,)


def test_epilogue_options_need_shapes():
    with pytest.raises(ConfigFileError, match="--epilogue: goes with --shapes"):
        sweep_space("x.yaml", epilogue="bias")
    with pytest.raises(ConfigFileError, match="--scaling: goes with --shapes"):
        sweep_space("x.yaml", scaling="rowcol")


def test_plain_problems_keep_their_configs(tmp_path):
    """Guards against the operation fields changing what a plain space file expands to."""
    sp = load_space(write(tmp_path, "problems: [{m: 256, n: 256, k: 64}]\nkernels: {tile_n: [128, 256]}"))
    assert [c.hash for c in sp.candidates] == [KernelConfig(tile_n=128).hash, KernelConfig(tile_n=256).hash]


@pytest.mark.parametrize("args, expected", [
    (["--shapes", "1024x1024x1024", "--epilogue", "bias+tanh"],
     "error: --shapes: epilogue.0 = 'bias+tanh': epilogue 'bias+tanh': unknown or repeated part 'tanh' (parts: bias, "
     "relu, gelu, gelu_tanh, silu, residual, gated, glu, glu-split, row-scale, joined by '+', or 'none')\n"),
    (["--shapes", "1024x1024x1024", "--scaling", "rowcol"],
     "error: --shapes: problems = '1024x1024x1024 tn scaling rowcol': scaling_inputs: fp8 scales (scaling tensor, "
     "rowcol or blockwise) apply to fp8 inputs (e4m3, e5m2) only; a 16-bit GEMM scales by alpha\n"),
    (["--epilogue", "bias"],
     "error: --epilogue: goes with --shapes (a space file gives its own epilogue and scaling)\n"),
])
def test_bad_sweep_epilogue_options_are_one_line_and_exit_2(args, expected):
    # refused before a GPU is looked for (none is visible here)
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "sweep", *args],
                       capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert (r.returncode, r.stdout, r.stderr) == (2, "", expected)
