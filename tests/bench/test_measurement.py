import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from cutlass_tune.measurement import (
    METHOD_FACTS,
    Clocks,
    EnvStamp,
    Measurement,
    TimingMethod,
    TimingScheme,
    read_jsonl,
    write_jsonl,
)
from cutlass_tune.space import (
    Decomposition,
    DType,
    KernelConfig,
    Layout,
    Problem,
    RasterOrder,
    RuntimeArgs,
    TileScheduler,
)
from cutlass_tune.status import Status

DATA = Path(__file__).with_name("data")
ENV = EnvStamp(host="h", gpu="NVIDIA H100 80GB HBM3", capability="9.0", sm_count=132,
               l2_bytes=52428800, driver=None, cuda_runtime="12.8", torch="2.13.0", nvcc=None, cutlass=None)


def _examples():
    p = Problem(1024, 2048, 512, dtype_d=DType.F32, layout_a=Layout.COL, layout_b=Layout.ROW)
    cfg = KernelConfig(dtype_c=DType.F32, dtype_d=DType.F32, layout_a=Layout.COL, layout_b=Layout.ROW,
                       tile_scheduler=TileScheduler.STREAM_K)
    variant = RuntimeArgs(raster=RasterOrder.ALONG_M, swizzle=8, splits=4, decomposition=Decomposition.SPLIT_K)
    ok = Measurement(p, cfg, variant, Status.OK, symbol="ct_x", median_ms=0.5, p20_ms=0.49,
                     p80_ms=0.52, samples=200, tflops=4.29, rel_error=3e-6, method="graph",
                     throttled=True, clocks=Clocks(1755, 2619, 60, 500.0, ("hw_slowdown",)), env=ENV,
                     compile_seconds=31.5, repeat=1, baseline_median_ms=0.55, baseline_p20_ms=0.54,
                     baseline_p80_ms=0.57)
    baseline = Measurement(p, None, RuntimeArgs(), Status.OK, is_baseline=True, median_ms=0.4, env=ENV)
    failed = Measurement(p, cfg, RuntimeArgs(), Status.TIMEOUT, reason="killed")
    return [ok, baseline, failed]


@pytest.mark.parametrize("m", _examples(), ids=["ok", "baseline", "failed"])
def test_round_trip_through_json(m):
    line = json.dumps(m.to_dict())
    assert Measurement.from_dict(json.loads(line)) == m


def test_names():
    ok, baseline, _ = _examples()
    assert baseline.kernel_name == "cuBLAS"
    assert ok.kernel_name == ok.config.name
    assert dataclasses.replace(ok, config=None).kernel_name == "ct_x"


def test_jsonl_lines_are_flushed_as_written(tmp_path):
    path = tmp_path / "r.jsonl"
    with open(path, "a") as f:
        for m in _examples():
            write_jsonl(f, m)
            # Readable before the file is closed: an interruption loses nothing written.
            assert len(path.read_text().splitlines()) == _examples().index(m) + 1
    assert list(read_jsonl(path)) == _examples()


def test_the_stored_schema_1_file_still_loads():
    loaded = list(read_jsonl(DATA / "measurements-v1.jsonl"))
    assert [m.status for m in loaded] == [Status.OK, Status.OK, Status.CANNOT_IMPLEMENT,
                                          Status.TIMEOUT, Status.COMPILE_ERROR]
    assert loaded[0].is_baseline and loaded[0].env.gpu == "NVIDIA H200" and loaded[0].throttled
    assert loaded[1].runtime == RuntimeArgs(raster=RasterOrder.ALONG_N, swizzle=4)
    assert loaded[2].config.tile_scheduler is TileScheduler.STREAM_K
    assert all(m.baseline_median_ms is None and m.paired_ratio is None for m in loaded)


def test_the_stored_schema_2_file_still_loads():
    loaded = list(read_jsonl(DATA / "measurements-v2.jsonl"))
    assert loaded == _examples()
    assert loaded[0].paired_ratio == pytest.approx(0.55 / 0.5)
    assert loaded[1].paired_ratio is None and loaded[2].paired_ratio is None


def test_unknown_schema_and_bad_lines_are_named(tmp_path):
    with pytest.raises(ValueError, match="schema 99"):
        Measurement.from_dict({**_examples()[0].to_dict(), "schema": 99})
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_examples()[0].to_dict()) + "\n{\"schema\": 1}\n")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        list(read_jsonl(path))


def _committed_schemes():
    """The timing scheme text of every committed store (ct_meta), as read from the files."""
    repo = Path(__file__).resolve().parents[2]
    found = set()
    for path in [*repo.glob("results/*.sqlite"), *repo.glob("tests/*/data/*.sqlite")]:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            found |= {v for (v,) in conn.execute("SELECT value FROM ct_meta WHERE key = 'timing'")}
    return found


def test_every_timing_scheme_name_reads_back_as_itself():
    committed = _committed_schemes()
    assert committed >= {"events", "events-paired"}
    names = {TimingScheme(m, paired).name for m in TimingMethod for paired in (False, True)}
    assert committed <= names and "sustained-paired" in names
    for name in names:
        assert TimingScheme.parse(name).name == str(TimingScheme.parse(name)) == name
    assert TimingScheme.parse("graph-paired") == TimingScheme(TimingMethod.GRAPH, paired=True)


@pytest.mark.parametrize("text", ["", "-paired", "events-paired-paired", "Events", "cupti", "x" * 500])
def test_a_timing_scheme_no_version_wrote_is_one_line(text):
    with pytest.raises(ValueError, match="unknown timing scheme") as err:
        TimingScheme.parse(text)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_every_method_has_its_facts_and_a_rank_of_its_own():
    assert set(METHOD_FACTS) == set(TimingMethod)
    assert sorted(f.rank for f in METHOD_FACTS.values()) == list(range(len(TimingMethod)))
    assert not TimingMethod.SUSTAINED.facts.races and TimingMethod.GRAPH.facts.races
