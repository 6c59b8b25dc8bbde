import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from cutlass_tune.measurement import Measurement
from cutlass_tune.report.dataset import CONFIG_COLUMNS, measurements_frame, write_frame
from cutlass_tune.space import KernelConfig, Problem, RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.store import ResultStore

REPO = Path(__file__).resolve().parents[2]
BENCH_V2 = REPO / "tests" / "bench" / "data" / "measurements-v2.jsonl"
COMMITTED = REPO / "results" / "measurements.csv.gz"
P = Problem(4096, 4096, 4096)
CFG = KernelConfig(tile_n=256, cluster_m=2, epilogue_source=False)


def _store(tmp_path) -> Path:
    path = tmp_path / "store.sqlite"
    store = ResultStore(f"sqlite:///{path}")
    store.bind_gpu("NVIDIA H200")
    ms = P.flops / 700.0 / 1e9
    paired = Measurement(problem=P, config=CFG, runtime=RuntimeArgs(swizzle=8), status=Status.OK, tflops=700.0,
                         median_ms=ms, p20_ms=ms, p80_ms=ms, samples=100, method="events",
                         baseline_median_ms=P.flops / 680.0 / 1e9)
    store.add(paired, gpu="NVIDIA H200", run_id="r1")
    store.add(Measurement(problem=P, config=CFG, runtime=RuntimeArgs(), status=Status.WRONG_RESULT,
                          reason="rel error 0.5\nlog line\n" + "x" * 400),
              gpu="NVIDIA H200", run_id="r2", cublas_tflops=750.0)
    return path


def test_one_row_per_measurement_with_every_knob_its_own_column(tmp_path):
    frame = measurements_frame([_store(tmp_path), BENCH_V2])
    assert len(frame) == 2 + 3
    first, failed = frame.iloc[0], frame.iloc[1]
    assert (first["m"], first["layout"], first["kernel"], first["config_hash"]) == (4096, "tn", CFG.name, CFG.hash)
    assert (first["tile_n"], first["cluster_m"], first["epilogue_source"], first["kernel_schedule"]) == \
        (256, 2, False, "cooperative")
    assert (first["swizzle"], first["raster"], first["splits"]) == (8, "heuristic", 1)
    assert first["ratio"] == pytest.approx(700 / 680) and first["paired"]
    assert (first["gpu"], first["source"], first["run_id"], first["method"]) == ("NVIDIA H200", "store.sqlite", "r1",
                                                                                "events")
    assert failed["status"] == "wrong_result" and failed["reason"] == "rel error 0.5"
    assert pd.isna(failed["ratio"]) and failed["run_id"] == "r2"
    bench = frame.iloc[2:]
    assert set(bench["source"]) == {BENCH_V2.name} and set(bench["run_id"]) == {BENCH_V2.stem}
    assert bench["gpu"].iloc[0] == "NVIDIA H100 80GB HBM3" and bench["decomposition"].iloc[0] == "split_k"


def test_baseline_rows_leave_the_config_columns_empty(tmp_path):
    path = tmp_path / "store.sqlite"
    store = ResultStore(f"sqlite:///{path}")
    store.bind_gpu("NVIDIA H200")
    store.add(Measurement(problem=P, config=None, runtime=RuntimeArgs(), status=Status.OK, is_baseline=True,
                          tflops=750.0, median_ms=0.2), gpu="NVIDIA H200", run_id="r1")
    row = measurements_frame([path]).iloc[0]
    assert row["is_baseline"] and row["kernel"] == "cuBLAS"
    assert all(pd.isna(row[c]) for c in CONFIG_COLUMNS + ("config_hash",))


def test_other_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a results store"):
        measurements_frame([tmp_path / "best.csv"])


def test_written_table_reads_back_the_same_and_byte_for_byte_again(tmp_path):
    frame = measurements_frame([_store(tmp_path), BENCH_V2])
    a, b = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"
    write_frame(frame, a)
    write_frame(frame, b)
    assert a.read_bytes() == b.read_bytes()
    back = pd.read_csv(a)
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)


def _config(row: pd.Series) -> KernelConfig:
    kinds = {f.name: type(f.default) for f in dataclasses.fields(KernelConfig)}
    values = {}
    for name, kind in kinds.items():
        v = row.get(name, "none")  # a table from before fused epilogues (epilogue, scaling) holds plain GEMMs
        v = "none" if pd.isna(v) else v  # so do its rows after columns for them were added
        if v == "none" and kind is int:  # a knob added after the table (scale_n): its default
            continue
        values[name] = (v in (True, "True")) if kind is bool else int(v) if kind is int else str(v)
    return KernelConfig.from_dict(values)


def test_committed_table_keeps_every_config_hash():
    # Regression guard: the table holds retired stores' rows keyed by hash; a changed hash orphans them.
    frame = pd.read_csv(COMMITTED, low_memory=False)
    configs = frame[frame["config_hash"].notna()].drop_duplicates("config_hash")
    assert len(configs) > 100
    assert all(_config(row).hash == row["config_hash"] for _, row in configs.iterrows())
