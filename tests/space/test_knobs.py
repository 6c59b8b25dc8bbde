"""The knob declarations (space/_knobs.py) and every place that derives from them."""

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from cutlass_tune import render
from cutlass_tune.search import config_of, params_of
from cutlass_tune.search._params import KNOBS
from cutlass_tune.space import (
    DType,
    Epilogue,
    KernelConfig,
    KernelSchedule,
    Problem,
    RuntimeArgs,
    Scaling,
    TileScheduler,
    cells,
    check_config,
    check_runtime,
    column_kinds,
    columns,
    load_space,
    texts,
)
from cutlass_tune.space._kinds import Number
from cutlass_tune.space._knobs import Knob, _declare
from cutlass_tune.space._spec import _knob_model, _Knobs, _Runtime

REPO = Path(__file__).resolve().parents[2]
OPERANDS = {"dtype_a", "dtype_b", "dtype_c", "dtype_d", "dtype_acc", "layout_a", "layout_b", "arch", "epilogue",
            "scaling", "grouping"}
FP8 = Problem(256, 256, 256, dtype_a=DType.E4M3, dtype_b=DType.E4M3)


@dataclasses.dataclass(frozen=True)
class _WithFake(KernelConfig):
    fake_depth: int = 2


def _fake_depth_problem(v):
    return None if v in (1, 2, 4) else "fake_depth must be 1, 2 or 4"


_declare(_WithFake, *KernelConfig.knobs,
         Knob("fake_depth", Number(_fake_depth_problem),
              lambda c: f"_d{c.fake_depth}" if c.fake_depth != 2 else "", "depth", added_later=True))
FAKE = _WithFake.knobs[-1]


def test_a_new_knob_is_one_entry():
    """Guards against a stage keeping its own list of knobs: an entry alone reaches each."""
    deep = _WithFake(fake_depth=4)
    model = _knob_model("_WithFakeKnobs", _WithFake.knobs, "")
    assert model.model_validate({"fake_depth": [1, 4]}).fake_depth == [1, 4]
    assert model().fake_depth == [2]
    with pytest.raises(ValueError, match="fake_depth must be 1, 2 or 4"):
        model.model_validate({"fake_depth": 3})
    assert [r.rule for r in check_config(_WithFake(fake_depth=3))] == ["fake_depth"]
    assert check_config(deep) == []
    assert params_of(deep)["fake_depth"] == "4"
    assert texts(deep)["fake_depth"] == "4" and FAKE.label == "depth"
    assert deep.name == KernelConfig().name + "_d4"
    assert _WithFake().hash == KernelConfig().hash != deep.hash  # added later: left out at its default
    assert deep.to_dict()["fake_depth"] == 4 and _WithFake.from_dict(deep.to_dict()) == deep
    assert _WithFake.from_knobs({"fake_depth": 4}) == deep
    assert columns(_WithFake)[-1] == "fake_depth" and columns(_WithFake, added_later=True)[-1] == "fake_depth"
    assert cells(deep)["fake_depth"] == 4 and column_kinds(_WithFake)["fake_depth"] == "integer"
    assert render.template_values(deep)["fake_depth"] == 4


def test_every_field_is_one_knobs():
    """Guards against a config field that no knob declares (no key, parameter or column)."""
    for owner, others in ((KernelConfig, OPERANDS), (RuntimeArgs, set())):
        declared = [f for k in owner.knobs for f in k.fields]
        assert sorted(declared) == sorted({f.name for f in dataclasses.fields(owner)} - others)
        assert columns(owner) == tuple(declared)


@pytest.mark.parametrize("knob", KernelConfig.knobs + RuntimeArgs.knobs, ids=lambda k: k.name)
def test_each_knob_reaches_every_stage(knob):
    """Guards against a knob missing from the space file's keys, the study's parameters, the
    tables' columns or the names, or a spelling that does not read back."""
    compile_time = knob in KernelConfig.knobs
    model, owner = (_Knobs, KernelConfig) if compile_time else (_Runtime, RuntimeArgs)
    assert getattr(model(), knob.name) == [knob.default]
    assert knob.of(owner()) == knob.default
    assert knob.kind.read(knob.kind.text(knob.default)) == knob.default
    assert set(knob.fields) <= set(columns(owner))
    assert (knob.name in KNOBS) == compile_time
    assert knob.label
    if compile_time:  # each in the study of a kind of kernel it applies to (scale_n: block-wise)
        fp8 = dict(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128)
        assert any(knob.name in params_of(KernelConfig(**fp8, scaling=scaling))
                   for scaling in (Scaling.ROWCOL, Scaling.BLOCKWISE))


def test_knob_columns_and_kinds():
    assert columns(KernelConfig) == (
        "tile_m", "tile_n", "tile_k", "cluster_m", "cluster_n", "stages", "kernel_schedule",
        "epilogue_schedule", "tile_scheduler", "fp8_fast_accum", "epilogue_tile_n", "epilogue_source", "swap_ab",
        "scale_n")
    assert columns(KernelConfig, added_later=True) == (
        "fp8_fast_accum", "epilogue_tile_n", "epilogue_source", "swap_ab", "scale_n")
    assert columns(RuntimeArgs) == ("raster", "swizzle", "splits", "decomposition")
    kinds = column_kinds(KernelConfig) | column_kinds(RuntimeArgs)
    assert {c for c, k in kinds.items() if k == "text"} == {
        "kernel_schedule", "epilogue_schedule", "tile_scheduler", "raster", "decomposition"}
    assert {c for c, k in kinds.items() if k == "flag"} == {"fp8_fast_accum", "epilogue_source", "swap_ab"}
    assert cells(RuntimeArgs()) == RuntimeArgs().to_dict() == {
        "raster": "heuristic", "swizzle": 1, "splits": 1, "decomposition": "heuristic"}


def test_runtime_args_round_trip_and_names():
    sk = RuntimeArgs(splits=2, decomposition=RuntimeArgs.knobs[3].kind.read("split_k"))
    assert RuntimeArgs.from_dict(sk.to_dict()) == sk
    assert sk.name == "rheuristic_sw1_sp2_split_k" and RuntimeArgs().name == "rheuristic_sw1"
    assert check_runtime(KernelConfig(tile_scheduler=TileScheduler.STREAM_K), sk) == []


def test_texts_are_the_dashboard_labels():
    cfg = KernelConfig(cluster_m=2, stages=4, kernel_schedule=KernelSchedule.PINGPONG)
    shown = texts(cfg)
    assert (shown["cluster"], shown["stages"], shown["kernel_schedule"]) == ("2x1", "4", "pingpong")
    assert texts(KernelConfig())["stages"] == "auto" and texts(KernelConfig())["epilogue_schedule"] == "auto"


def _stored_configs(path: Path) -> list[tuple[str, dict]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT config_hash, record FROM ct_measurements").fetchall()
    return [(h, json.loads(r)["config"]) for h, r in rows if json.loads(r)["config"] is not None]


@pytest.mark.parametrize("store", sorted((REPO / "results").glob("*.sqlite")), ids=lambda p: p.stem)
def test_committed_configs_keep_their_hashes(store):
    """Guards against a change to the declarations rehashing configs (stores are keyed by hash)."""
    stored = _stored_configs(store)
    assert stored
    for config_hash, config in stored:
        assert KernelConfig.from_dict(config).hash == config_hash, config


def test_params_round_trip_for_every_config_of_the_committed_spaces():
    for name in ("configs/sm90_bf16.yaml", "benchmarks/configs/epilogue_knobs_bf16.yaml", "configs/fp8_quick.yaml"):
        sp = load_space(REPO / name)
        problem = sp.problems[0]
        for cfg in sp.candidates:
            assert config_of(params_of(cfg), problem) == cfg


def test_operation_fields_round_trip_and_keep_plain_hashes():
    """Guards against the epilogue and scaling fields changing the hash of plain configs (the
    stores are keyed by it) or being lost on the way through JSON."""
    plain = KernelConfig()
    assert "epilogue" not in plain.to_dict() and "scaling" not in plain.to_dict()
    assert plain.hash == "4faaee0d329d4c76"
    fused = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, epilogue=Epilogue.parse("bias+silu"),
                         scaling=Scaling.ROWCOL)
    data = json.loads(json.dumps(fused.to_dict()))
    assert data["epilogue"] == "bias+silu" and data["scaling"] == "rowcol"
    assert KernelConfig.from_dict(data) == fused
    assert fused.hash != dataclasses.replace(fused, scaling=Scaling.TENSOR).hash
    assert fused.name.endswith("_persistent_bias+silu_scale-rowcol")
    assert KernelConfig.from_dict(plain.to_dict()).epilogue == Epilogue()
    with pytest.raises(ValueError, match="unknown or repeated part 'swish'"):
        KernelConfig.from_dict({"epilogue": "bias+swish"})
