"""Optuna parameters of the shipped and benchmark spaces: studies made before a change resume after it."""

from pathlib import Path

import pytest

from cutlass_tune.search import ParamSpace, config_of
from cutlass_tune.space import load_space

REPO = Path(__file__).resolve().parents[2]

CHOICES = {
    "configs/sm90_bf16.yaml": {
        "tile_m": ("64", "128", "256"), "tile_n": ("64", "128", "256"), "tile_k": ("64", "128"),
        "cluster": ("1x1", "2x1", "1x2", "2x2", "4x1", "1x4"), "stages": ("auto", "3", "4", "5", "6", "7"),
        "kernel_schedule": ("tma_ws", "cooperative", "pingpong"), "epilogue_schedule": ("auto",),
        "tile_scheduler": ("persistent", "stream_k"),
    },
    "benchmarks/configs/epilogue_knobs_bf16.yaml": {
        "tile_m": ("64", "128"), "tile_n": ("128", "192", "256"), "tile_k": ("64",), "cluster": ("1x1", "2x1"),
        "stages": ("auto",), "kernel_schedule": ("tma_ws", "pingpong", "cooperative"),
        "epilogue_schedule": ("auto",), "tile_scheduler": ("persistent",),
        "epilogue_tile_n": ("auto", "64", "128"), "epilogue_source": ("true", "false"),
    },
    "configs/fp8_quick.yaml": {
        "tile_m": ("128", "64"), "tile_n": ("256", "128"), "tile_k": ("128",), "cluster": ("2x1", "1x1"),
        "stages": ("auto",), "kernel_schedule": ("cooperative", "pingpong"), "epilogue_schedule": ("auto",),
        "tile_scheduler": ("persistent",), "fp8_fast_accum": ("true", "false"),
    },
}


@pytest.mark.parametrize("name", CHOICES)
def test_parameter_names_and_choices_are_unchanged(name):
    """Guards against renaming a parameter or respelling a choice, which would leave a resumed
    study unable to read its own trials."""
    sp = load_space(REPO / name)
    for problem in sp.problems:
        params = ParamSpace.from_space(sp, problem)
        assert params.choices == CHOICES[name]
        assert list(params.choices) == list(CHOICES[name])
        for cfg in sp.candidates:
            assert config_of(params.params(cfg), problem) == cfg
