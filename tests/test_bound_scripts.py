"""benchmarks/grouped_roofline.py and benchmarks/fusion_bound.py: the floors and bounds they
compute from measurements, checked by hand on made-up figures."""

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from cutlass_tune.space import Problem, Routing

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _measurement(problem, method, ms, *, tile_m=None, dense_ms=None):
    ok = SimpleNamespace(value="ok")
    config = None if tile_m is None else SimpleNamespace(hash=f"h{tile_m}", tile_m=tile_m)
    return SimpleNamespace(problem=problem, status=ok, median_ms=ms, is_baseline=config is None, method=method,
                           dense_median_ms=dense_ms, config=config, runtime=SimpleNamespace(name="r"))


def test_the_floor_is_the_larger_of_the_bytes_and_the_tiles_flops_at_the_dense_rate():
    roofline = _module("grouped_roofline")
    # 4 experts of 256 x 128 weights, 64 rows each but skewed: 100, 60, 60, 36 -> with 64-row
    # tiles 128 + 64 + 64 + 64 = 320 padded rows.
    p = Problem.experts(4, 256, 128, 256, routing=Routing.HISTOGRAM, group_rows=(100, 60, 60, 36))
    dense_ms, ours_ms, torch_ms = 0.010, 0.020, 0.030
    rows = roofline.roofline([_measurement(p, "events", torch_ms, dense_ms=dense_ms),
                              _measurement(p, "events", ours_ms, tile_m=64),
                              _measurement(p, "events", 0.5, tile_m=128)], None, bandwidth=1e12)
    (r,) = rows
    assert r["tile_m"] == 64 and r["method"] == "events"  # the fastest kernel, not the 128-row one
    bytes_ = 2 * (4 * 256 * 128 + 256 * 128 + 256 * 256)
    dense_rate = 2 * 256 * 256 * 128 / (dense_ms * 1e-3)
    compute_us = 2 * 320 * 256 * 128 / dense_rate * 1e6
    assert r["memory_us"] == pytest.approx(bytes_ / 1e12 * 1e6)
    assert r["compute_us"] == pytest.approx(compute_us) and r["tile_use"] == pytest.approx(256 / 320)
    assert r["floor_us"] == pytest.approx(max(compute_us, bytes_ / 1e12 * 1e6))
    assert r["floor_of_dense"] == pytest.approx(dense_ms * 1e3 / r["floor_us"])
    assert r["torch_over_ours"] == pytest.approx(1.5)
    # Granting every problem 64-row tiles changes nothing here; 128-row tiles pad to 512 rows.
    wide = roofline.roofline([_measurement(p, "events", torch_ms, dense_ms=dense_ms),
                              _measurement(p, "events", ours_ms, tile_m=64)], None, 1e12, tile_m=128)
    assert wide[0]["tile_use"] == pytest.approx(0.5)


def test_the_sustained_pair_is_preferred_and_methods_are_never_mixed():
    roofline = _module("grouped_roofline")
    p = Problem.experts(2, 128, 128, 128)
    rows = roofline.roofline([_measurement(p, "events", 1.0, dense_ms=0.5),
                              _measurement(p, "events", 0.5, tile_m=64),
                              _measurement(p, "sustained", 2.0, dense_ms=1.0),
                              _measurement(p, "sustained", 1.0, tile_m=64)], None, 1e12)
    assert rows[0]["method"] == "sustained" and rows[0]["torch_over_ours"] == pytest.approx(2.0)
    assert rows[0]["ours_of_dense"] == pytest.approx(1.0)
    text = roofline.render(rows, 1e12)
    assert "geomean torch / ours 2.000" in text and "<= 512 rows per expert: 1 problems" in text


def test_the_fusion_bound_prices_the_removed_passes_against_the_measured_step(tmp_path):
    bound = _module("fusion_bound")
    for family, mode, plain in [("llama", "infer-graphs", 6.0), ("gpt_neox", "infer-graphs", 6.0),
                                ("llama", "infer-compile", 9.0), ("bert", "infer", 3.0)]:
        run = {"family": family, "mode": mode, "median_ms": {"plain": plain, "fused": plain / 1.02}}
        (tmp_path / f"{family}-{mode}.json").write_text(json.dumps(run))
    rows = {(r["family"], r["regime"]): r for r in bound.bounds(bound._measured([tmp_path]), 2e12)}
    llama = rows[("llama", "compiled")]
    assert llama["mode"] == "infer-graphs"  # CUDA graphs over plain compile: no host time in the step
    saved_ms = 2 * (2 * 4096 * 14336 + 2 * 4096 * 4096) * 2 / 2e12 * 1e3  # 2 layers, bf16
    assert llama["saved_ms"] == pytest.approx(saved_ms)
    assert llama["bound"] == pytest.approx(6.0 / (6.0 - saved_ms)) and llama["measured"] == pytest.approx(1.02)
    gpt = rows[("gpt_neox", "compiled")]  # the tanh-GELU pass: M x I read and written, 2 layers
    assert gpt["saved_ms"] == pytest.approx(2 * 2 * 4096 * 16384 * 2 / 2e12 * 1e3)
    assert math.isclose(rows[("bert", "eager")]["saved_mb_per_layer"], (2 * 8192 * 4096 + 4 * 8192 * 1024) * 2 / 1e6)
    assert ("gpt_neox", "eager") not in rows  # no run of it in the folder
