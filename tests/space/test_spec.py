from pathlib import Path

import pytest

from cutlass_tune.errors import ConfigFileError
from cutlass_tune.space import (
    Decomposition,
    DType,
    EpilogueSchedule,
    KernelSchedule,
    Layout,
    Problem,
    RasterOrder,
    TileScheduler,
    load_space,
)

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """
problems: [{m: 256, n: [128, 256], k: 64}]
kernels:
  tile_m: [64, 128]
  cluster: [1x1, [2, 1]]
  kernel_schedule: [cooperative, pingpong]
  tile_scheduler: [persistent, stream_k]
runtime: {raster: [heuristic, along_n], swizzle: [1, 2], splits: [1, 2], decomposition: [heuristic, split_k]}
"""


def write(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_minimal_space_expands(tmp_path):
    sp = load_space(write(tmp_path, MINIMAL))
    assert sp.problems == (Problem(256, 128, 64), Problem(256, 256, 64))
    assert len(sp.candidates) == 2 * 2 * 2 * 2
    valid = sp.valid
    # cooperative with tile M 64 and Stream-K with ping-pong are the invalid ones
    assert len(valid) == 8 and all(
        c.kernel_schedule is KernelSchedule.COOPERATIVE and c.tile_m == 128
        or c.kernel_schedule is KernelSchedule.PINGPONG and c.tile_scheduler is TileScheduler.PERSISTENT
        for c in valid
    )
    coop = next(c for c in valid if c.kernel_schedule is KernelSchedule.COOPERATIVE)
    assert coop.epilogue_schedule is EpilogueSchedule.TMA_COOPERATIVE  # "auto" pairs it
    ping = next(c for c in valid if c.kernel_schedule is KernelSchedule.PINGPONG)
    assert ping.epilogue_schedule is EpilogueSchedule.TMA


def test_runtime_variants_respect_the_tile_scheduler(tmp_path):
    sp = load_space(write(tmp_path, MINIMAL))
    persistent = next(c for c in sp.valid if c.tile_scheduler is TileScheduler.PERSISTENT)
    stream_k = next(c for c in sp.valid if c.tile_scheduler is TileScheduler.STREAM_K)
    assert len(sp.runtime_variants(persistent)) == 4  # raster x swizzle
    variants = sp.runtime_variants(stream_k)
    assert len(variants) == 2 * 2 * 4  # raster x swizzle x (splits x decomposition)
    assert {v.raster for v in variants} == {RasterOrder.HEURISTIC, RasterOrder.ALONG_N}
    assert {(v.splits, v.decomposition) for v in variants} == {
        (1, Decomposition.HEURISTIC), (1, Decomposition.SPLIT_K),
        (2, Decomposition.HEURISTIC), (2, Decomposition.SPLIT_K)}


def test_layouts_and_dtypes(tmp_path):
    sp = load_space(write(tmp_path, """
problems: {m: 64, n: 64, k: 64}
dtypes: [f16, {input: bf16, output: f32}]
layouts: [nt]
"""))
    assert [(p.dtype_a.value, p.dtype_d.value) for p in sp.problems] == [("f16", "f16"), ("bf16", "f32")]
    assert all(c.layout_a is Layout.COL and c.layout_b is Layout.ROW for c in sp.candidates)


@pytest.mark.parametrize("text,key,value", [
    ("problems: [{m: 1, n: 1, k: 1}\n", "line", None),
    ("problems: {m: 64, n: 64, k: 64}\ncolour: red\n", "colour", "red"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {tile_m: [128, 100]}\n", "kernels.0.tile_m.1", 100),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {cluster: [3x3]}\n", "kernels.0.cluster.0", "3x3"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {stages: [auto, 1]}\n", "kernels.0.stages.1", 1),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {kernel_schedule: warp_drive}\n",
     "kernels.0.kernel_schedule.0", "warp_drive"),
    ("problems: {m: 64, n: 64, k: 0}\n", "problems.0.k.0", 0),
    ("problems: {m: 64, n: 64, k: 100}\n", "problems", "64x64x100 tn"),
    ("problems: {m: 64, n: 64, k: 64}\nruntime: {swizzle: 3}\n", "runtime.swizzle.0", 3),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {fp8_fast_accum: [false, \"true\"]}\n",
     "kernels.0.fp8_fast_accum.1", "true"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {fp8_fast_accum: 1}\n", "kernels.0.fp8_fast_accum.0", 1),
    ("problems: {m: 64, n: 64, k: 64}\ndtypes: {input: e4m3, output: bf16}\nlayouts: nt\n",
     "problems", "64x64x64 nt"),
    ("problems: {m: 64, n: 64, k: 72}\ndtypes: {input: e4m3, output: bf16}\n", "problems", "64x64x72 tn"),
    ("problems: {m: 64, n: 64, k: 64}\ndtypes: {input: e3m4, output: bf16}\n", "dtypes.0.input", "e3m4"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {epilogue_tile_n: [auto, 40]}\n",
     "kernels.0.epilogue_tile_n.1", 40),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {epilogue_tile_n: wide}\n", "kernels.0.epilogue_tile_n.0", "wide"),
    ("problems: {m: 64, n: 64, k: 64}\nkernels: {epilogue_source: \"no\"}\n", "kernels.0.epilogue_source.0", "no"),
    ("kernels: {}\n", "problems", None),
    ("- a list\n", "", None),
])
def test_bad_files_name_file_key_and_value(tmp_path, text, key, value):
    path = write(tmp_path, text)
    with pytest.raises(ConfigFileError) as info:
        load_space(path)
    e = info.value
    assert str(path) in str(e)
    assert e.key.startswith(key)
    if value is not None:
        assert e.value == value and repr(value) in str(e)
    assert "\n" not in str(e)


def test_alignment_error_names_the_rule(tmp_path):
    with pytest.raises(ConfigFileError, match="TMA needs the contiguous dimension"):
        load_space(write(tmp_path, "problems: {m: 64, n: 64, k: 100}\n"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_space(tmp_path / "nope.yaml")


def test_shipped_configs_load():
    quick = load_space(REPO / "configs" / "quick.yaml")
    assert len(quick.valid) == len(quick.candidates) >= 4
    broad = load_space(REPO / "configs" / "sm90_bf16.yaml")
    assert len(broad.problems) == 3
    tiles = {(c.tile_m, c.tile_n, c.tile_k) for c in broad.candidates}
    assert len(tiles) == 18
    assert {(c.cluster_m, c.cluster_n) for c in broad.candidates} == {(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4)}
    assert {c.stages for c in broad.candidates} == {0, 3, 4, 5, 6, 7}
    assert {c.kernel_schedule for c in broad.candidates} == set(KernelSchedule)
    assert {c.tile_scheduler for c in broad.candidates} == set(TileScheduler)
    assert 0 < len(broad.valid) < len(broad.candidates)


def test_fp8_dtype_and_fast_accum_knob(tmp_path):
    sp = load_space(write(tmp_path, """
problems: {m: 4096, n: 4096, k: 4096}
dtypes: [{input: e4m3, output: bf16}, bf16]
kernels: {tile_k: 128, fp8_fast_accum: [false, true]}
"""))
    assert [(p.dtype_a, p.dtype_b, p.dtype_d) for p in sp.problems] == [
        (DType.E4M3, DType.E4M3, DType.BF16), (DType.BF16, DType.BF16, DType.BF16)]
    classified = {(c.dtype_a, c.fp8_fast_accum): [r.rule for r in why] for c, why in sp.classify()}
    assert classified == {
        (DType.E4M3, False): [], (DType.E4M3, True): [],
        (DType.BF16, False): [],
        (DType.BF16, True): ["fp8_fast_accum"],  # counted as invalid, not a file error
    }


def test_fast_accum_defaults_to_false(tmp_path):
    sp = load_space(write(tmp_path, "problems: {m: 64, n: 64, k: 64}\ndtypes: {input: e5m2, output: f32}\n"))
    assert [c.fp8_fast_accum for c in sp.candidates] == [False]
    assert sp.candidates[0].dtype_a is DType.E5M2 and sp.candidates[0].dtype_d is DType.F32


def test_shipped_fp8_config():
    sp = load_space(REPO / "configs" / "fp8_quick.yaml")
    assert {(p.m, p.dtype_a, p.dtype_d) for p in sp.problems} == {
        (4096, DType.E4M3, DType.BF16), (8192, DType.E4M3, DType.BF16)}
    assert len(sp.valid) == len(sp.candidates) == 5
    assert sum(c.fp8_fast_accum for c in sp.candidates) == 4
    assert all(c.tile_k == 128 and c.layout_a is Layout.ROW and c.layout_b is Layout.COL for c in sp.candidates)
    assert all(len(sp.runtime_variants(c)) == 4 for c in sp.candidates)


def test_epilogue_knobs(tmp_path):
    sp = load_space(write(tmp_path, """
problems: {m: 4096, n: 4096, k: 4096}
kernels:
  - {tile_n: 128, kernel_schedule: pingpong, epilogue_tile_n: [auto, 64, 96], epilogue_source: [true, false]}
  - {tile_n: 128, kernel_schedule: pingpong, epilogue_schedule: no_smem, epilogue_source: false}
"""))
    classified = {(c.epilogue_schedule.value, c.epilogue_tile_n, c.epilogue_source): [r.rule for r in why]
                  for c, why in sp.classify()}
    assert classified == {
        ("tma", 0, True): [], ("tma", 0, False): [], ("tma", 64, True): [], ("tma", 64, False): [],
        ("tma", 96, True): ["epilogue_tile"], ("tma", 96, False): ["epilogue_tile"],
        ("no_smem", 0, False): ["epilogue_source"],
    }
