"""One contract, run against every backend (SQLite file and PostgreSQL server)."""

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from cutlass_tune.measurement import Measurement, TimingMethod, TimingScheme, read_jsonl
from cutlass_tune.space import Activation, DType, Epilogue, KernelConfig, Problem, RuntimeArgs, Scaling
from cutlass_tune.status import Status
from cutlass_tune.store import (
    ResultStore,
    StoredRow,
    StoreError,
    StoreGpuMismatchError,
    _migrate,
    _sql,
    default_store_url,
)

from ..racing import start_together, wait_for_files

P = Problem(4096, 4096, 4096)
CFG = KernelConfig(tile_n=256, cluster_m=2)
V1, V2 = RuntimeArgs(), RuntimeArgs(swizzle=8)
EVENTS, GRAPH = TimingScheme(TimingMethod.EVENTS), TimingScheme(TimingMethod.GRAPH)
STORED_V1 = Path(__file__).resolve().parents[1] / "bench" / "data" / "measurements-v1.jsonl"


def ok(variant, tflops):
    return Measurement(problem=P, config=CFG, runtime=variant, status=Status.OK, tflops=tflops,
                       median_ms=P.flops / tflops / 1e9, p20_ms=0.1, p80_ms=0.2, samples=100)


def test_round_trip_and_ratio(store_url):
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    store.add(ok(V1, 700.0), gpu="NVIDIA H200", run_id="r1", cublas_tflops=750.0, study="s", trial=3)
    store.add(Measurement(problem=P, config=CFG, runtime=V2, status=Status.WRONG_RESULT, reason="rel error 0.5"),
              gpu="NVIDIA H200", run_id="r1", cublas_tflops=750.0)
    rows = store.rows()
    assert [r.status for r in rows] == [Status.OK, Status.WRONG_RESULT]
    assert rows[0].ratio == pytest.approx(700 / 750) and rows[1].ratio is None
    assert rows[0].kernel == CFG.name and rows[0].layout == "tn" and rows[0].trial == 3 and rows[0].record is None
    assert store.measurements()[0] == ok(V1, 700.0)
    measured = store.measured(P)
    assert set(measured) == {(CFG.hash, V1.name), (CFG.hash, V2.name)}
    assert measured[(CFG.hash, V2.name)][0].reason == "rel error 0.5"


def test_a_stored_row_has_an_attribute_per_column():
    # Guards against a column added to the table but not to StoredRow, which rows() cannot then read.
    assert [f.name for f in dataclasses.fields(StoredRow)] == [c.name for c in _sql.measurements_table.c]


def test_a_paired_measurement_is_rated_against_its_own_baseline(store_url):
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    paired = dataclasses.replace(ok(V1, 700.0), baseline_median_ms=P.flops / 680.0 / 1e9)
    store.add(paired, gpu="NVIDIA H200", run_id="r1", cublas_tflops=750.0)  # 750: taken minutes before
    row = store.rows()[0]
    assert row.cublas_tflops == pytest.approx(680.0) and row.ratio == pytest.approx(700 / 680)
    assert store.measurements()[0].paired_ratio == pytest.approx(700 / 680)


def test_reopening_sees_what_was_written(store_url):
    first = ResultStore(store_url)
    first.bind_gpu("NVIDIA H200")
    first.add(ok(V1, 650.0), gpu="NVIDIA H200", run_id="r1")
    again = ResultStore(store_url)
    again.bind_gpu("NVIDIA H200")
    assert again.gpu() == "NVIDIA H200"
    assert [m.tflops for m in again.measurements()] == [650.0]


def test_rows_after_an_id_are_those_another_writer_added_since(store_url):
    mine, theirs = ResultStore(store_url), ResultStore(store_url)
    mine.add(ok(V1, 600.0), gpu="NVIDIA H200", run_id="r1")
    seen = mine.rows(["id"])[-1].id
    theirs.add(ok(V2, 610.0), gpu="NVIDIA H200", run_id="r2")
    theirs.add(ok(V1, 620.0), gpu="NVIDIA H200", run_id="r2")
    new = mine.rows(["id", "tflops", "run_id"], after_id=seen)
    assert [(r.tflops, r.run_id) for r in new] == [(610.0, "r2"), (620.0, "r2")]
    assert mine.rows(["id"], after_id=new[-1].id) == []


def test_a_store_keeps_to_one_gpu(store_url):
    ResultStore(store_url).bind_gpu("NVIDIA H200")
    with pytest.raises(StoreGpuMismatchError, match="holds results from NVIDIA H200, not NVIDIA H100"):
        ResultStore(store_url).bind_gpu("NVIDIA H100 80GB HBM3")


def test_stored_schema_v1_records_load(store_url):
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    for m in read_jsonl(STORED_V1):
        store.add(m, gpu="NVIDIA H200", run_id="old")
    assert store.measurements() == list(read_jsonl(STORED_V1))


@pytest.mark.parametrize("url,message", [
    ("not a url", "cannot parse storage URL"),
    ("nosuchdb://x/y", "no driver"),
    ("postgresql+psycopg://nobody@127.0.0.1:1/none", "cannot reach the store"),
])
def test_bad_urls_are_one_line_errors(url, message):
    with pytest.raises(StoreError, match=message) as info:
        ResultStore(url)
    assert "\n" not in str(info.value)


def test_default_store_is_per_gpu():
    assert default_store_url("NVIDIA H200") == "sqlite:///results/sweep-nvidia-h200.sqlite"
    assert default_store_url("NVIDIA H100 80GB HBM3").endswith("sweep-nvidia-h100-80gb-hbm3.sqlite")


def test_reading_a_store_writes_nothing_to_it(tmp_path):
    # Guards against reports (best, dashboard) adding the sweep's newer tables to a committed store.
    import hashlib

    path = tmp_path / "older.sqlite"
    path.write_bytes((Path(__file__).resolve().parents[2] / "results" / "squares-paired-nvidia-h200.sqlite")
                     .read_bytes())  # a store no sweep of this version wrote to: no claims table
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    store = ResultStore(f"sqlite:///{path}")
    assert store.gpu() == "NVIDIA H200" and store.timing() == TimingScheme(TimingMethod.EVENTS, paired=True)
    assert len(store.rows()) == len(store.measurements()) == 3184
    assert store.measured(Problem(4096, 4096, 4096))
    assert "ct_claims" not in sa.inspect(store.engine).get_table_names()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_new_store_reads_as_empty_until_a_sweep_binds_it(store_url):
    store = ResultStore(store_url)
    assert (store.gpu(), store.timing(), store.rows(), store.measured(P)) == (None, None, [], {})
    store.bind_gpu("NVIDIA H200")
    assert store.rows() == [] and ResultStore(store_url).gpu() == "NVIDIA H200"


def test_a_new_sqlite_store_is_made_by_its_first_write_only(tmp_path):
    # Guards against a sweep that stops before measuring (no GPU) leaving an empty database.
    path = tmp_path / "new" / "folder" / "x.sqlite"
    store = ResultStore(f"sqlite:///{path}")
    assert (store.gpu(), store.rows()) == (None, [])
    assert not (tmp_path / "new").exists()
    store.bind_gpu("NVIDIA H200")
    assert path.is_file() and ResultStore(f"sqlite:///{path}").gpu() == "NVIDIA H200"


def test_a_store_under_a_file_is_refused_at_once(tmp_path):
    (tmp_path / "plain").write_text("not a folder")
    with pytest.raises(StoreError, match="plain is a file, not a folder"):
        ResultStore(f"sqlite:///{tmp_path / 'plain' / 'x.sqlite'}")


def test_a_store_keeps_to_one_timing_method(store_url):
    store = ResultStore(store_url)
    assert store.timing() is None
    store.bind_timing(EVENTS)
    store.bind_timing(EVENTS)
    assert ResultStore(store_url).timing() == EVENTS
    with store.engine.connect() as conn:  # as every store holds it
        assert conn.execute(sa.text("SELECT value FROM ct_meta WHERE key = 'timing'")).scalar() == "events"


def test_a_store_whose_timing_record_no_version_wrote_is_damaged(store_url):
    store = ResultStore(store_url)
    store.bind_timing(EVENTS)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE ct_meta SET value = 'events-twice' WHERE key = 'timing'"))
    with pytest.raises(StoreError, match="is damaged: ct_meta records the timing scheme 'events-twice'"):
        store.timing()


def test_a_store_older_than_its_timing_record_holds_unpaired_events(store_url):
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    store.add(ok(V1, 700.0), gpu="NVIDIA H200", run_id="r1", cublas_tflops=750.0)  # no bind_timing
    assert store.timing() == EVENTS
    with pytest.raises(StoreError, match="timed with events, not events-paired"):
        store.bind_timing(TimingScheme(TimingMethod.EVENTS, paired=True))
    store.bind_timing(EVENTS)
    assert store.timing() == EVENTS
    with pytest.raises(StoreError, match="timed with events, not graph"):
        ResultStore(store_url).bind_timing(GRAPH)


def test_stores_opened_at_once_make_the_tables_once(store_url, monkeypatch):
    # Guards against the second of two sweeps opening a new store failing on the tables the first made meanwhile.
    real_locked = _migrate._locked
    theirs = ResultStore(store_url)
    calls, creates = [], []

    def racing(engine):
        calls.append(engine)
        if len(calls) == 1:  # the other process makes the tables between our look and our lock
            theirs.bind_gpu("NVIDIA H200")
        return real_locked(engine)

    def count(conn, cursor, statement, *args):
        if statement.lstrip().startswith("CREATE TABLE ct_measurements"):
            creates.append(statement)

    monkeypatch.setattr(_migrate, "_locked", racing)
    sa.event.listen(sa.Engine, "before_cursor_execute", count)
    try:
        mine = ResultStore(store_url)
        mine.bind_gpu("NVIDIA H200")
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", count)
    assert len(calls) == 2 and len(creates) == 1
    assert mine.gpu() == theirs.gpu() == "NVIDIA H200"


def test_two_sweeps_claiming_a_new_store_at_once_agree_on_its_gpu(store_url):
    mine, theirs = ResultStore(store_url), ResultStore(store_url)

    @sa.event.listens_for(mine.engine, "before_cursor_execute")
    def race(conn, cursor, statement, parameters, *args):
        if statement.startswith("INSERT INTO ct_meta") and "gpu" in str(parameters) and theirs.gpu() is None:
            theirs.bind_gpu("NVIDIA H100 80GB HBM3")  # lands between our look and our insert

    with pytest.raises(StoreGpuMismatchError, match="holds results from NVIDIA H100 80GB HBM3, not NVIDIA H200"):
        mine.bind_gpu("NVIDIA H200")
    theirs.bind_timing(GRAPH)
    with pytest.raises(StoreError, match="timed with graph, not events"):
        mine.bind_timing(EVENTS)


RACER = """
import pathlib, sys, time
from cutlass_tune.store import ResultStore, open_study_storage
url, me = sys.argv[1], pathlib.Path(sys.argv[2])
me.with_suffix(".ready").touch()
while not me.with_name("go").exists():
    time.sleep(0.001)
ResultStore(url).bind_gpu("NVIDIA H200")
open_study_storage(url)
"""


def test_sweeps_started_at_once_on_a_new_store_all_open_it(store_url, tmp_path):
    racers = start_together([[sys.executable, "-c", RACER, store_url, str(tmp_path / f"racer{i}")]
                             for i in range(4)], tmp_path)
    errors = [r.communicate(timeout=120)[1] for r in racers]
    assert [r.returncode for r in racers] == [0] * len(racers), "\n".join(errors)
    assert ResultStore(store_url).gpu() == "NVIDIA H200"
    assert sa.inspect(ResultStore(store_url).engine).has_table("studies")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _add_run(store, run_id, *, host, pid, age_s=0.0):
    with store.engine.begin() as conn:
        conn.execute(_sql.runs_table.insert(), {"run_id": run_id, "host": host, "pid": pid,
                                                "heartbeat_at": time.time() - age_s})


def test_a_config_is_one_live_sweeps_until_it_lets_go(store_url):
    a, b = ResultStore(store_url), ResultStore(store_url)
    with a.running("run-a"), b.running("run-b"):
        assert a.claim(CFG.hash, "run-a") is None
        assert a.claim(CFG.hash, "run-a") is None  # again: still its own
        assert b.claim(CFG.hash, "run-b") == "run-a"
        assert b.claim("0" * 16, "run-b") is None  # another config is free
        a.release(CFG.hash, "run-a")
        assert b.claim(CFG.hash, "run-b") is None
        assert a.claim(CFG.hash, "run-a") == "run-b"


def test_ending_a_run_frees_its_claims_however_it_ends(store_url):
    store = ResultStore(store_url)
    with pytest.raises(KeyboardInterrupt):
        with store.running("run-a"):
            assert store.claim(CFG.hash, "run-a") is None
            raise KeyboardInterrupt
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(_sql.claims_table.c.run_id)).all() == []
        assert conn.execute(sa.select(_sql.runs_table.c.run_id)).all() == []
    with store.running("run-b"):
        assert store.claim(CFG.hash, "run-b") is None


@pytest.mark.parametrize("owner, alive", [
    ({"host": "this", "pid": "dead"}, False),   # killed on this host: free at once
    ({"host": "this", "pid": "mine"}, True),
    ({"host": "gpu-host-7", "pid": 1, "age_s": 5.0}, True),  # another host that spoke lately
    ({"host": "gpu-host-7", "pid": 1, "age_s": _sql.STALE_AFTER_S + 5}, False),  # silent too long
    ({"host": "this", "pid": "mine", "age_s": _sql.STALE_AFTER_S + 5}, False),
])
def test_a_dead_sweeps_claim_is_taken_over_and_a_live_ones_is_not(store_url, owner, alive):
    import socket
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")  # creates the tables
    host = socket.gethostname() if owner["host"] == "this" else owner["host"]
    pid = {"dead": _dead_pid(), "mine": os.getpid()}.get(owner["pid"], owner["pid"])
    with store.running("run-new"):  # the old one dies while the new one runs
        _add_run(store, "run-old", host=host, pid=pid, age_s=owner.get("age_s", 0.0))
        with store.engine.begin() as conn:
            conn.execute(_sql.claims_table.insert(), {"config_hash": CFG.hash, "run_id": "run-old"})
        assert store.live_runs() == ({"run-new", "run-old"} if alive else {"run-new"})
        assert store.claim(CFG.hash, "run-new") == ("run-old" if alive else None)


def test_a_sweep_starting_forgets_dead_sweeps_and_their_claims(store_url):
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")  # creates the tables
    _add_run(store, "run-dead", host="gpu-host-7", pid=1, age_s=_sql.STALE_AFTER_S + 5)
    _add_run(store, "run-live", host="gpu-host-7", pid=1)
    with store.engine.begin() as conn:
        conn.execute(_sql.claims_table.insert(), [{"config_hash": "0" * 16, "run_id": "run-dead"},
                                                  {"config_hash": "1" * 16, "run_id": "run-live"}])
    with store.running("run-new"):
        with store.engine.connect() as conn:
            assert {r.run_id for r in conn.execute(sa.select(_sql.runs_table.c.run_id))} == {"run-live", "run-new"}
            assert conn.execute(sa.select(_sql.claims_table.c.run_id)).scalars().all() == ["run-live"]


def test_a_running_sweep_keeps_speaking(store_url, monkeypatch):
    monkeypatch.setattr(_sql, "HEARTBEAT_S", 0.05)
    store = ResultStore(store_url)
    beat = sa.select(_sql.runs_table.c.heartbeat_at)
    with store.running("run-a"):
        with store.engine.connect() as conn:
            first = conn.execute(beat).scalar_one()
        time.sleep(0.5)
        with store.engine.connect() as conn:
            assert conn.execute(beat).scalar_one() > first


CLAIMER = """
import pathlib, sys, time
from cutlass_tune.store import ResultStore
url, me = sys.argv[1], pathlib.Path(sys.argv[2])
store = ResultStore(url)
with store.running(me.name):
    me.with_suffix(".ready").touch()
    while not me.with_name("go").exists():
        time.sleep(0.001)
    won = [h for h in sys.argv[3:] if store.claim(h, me.name) is None]
    me.with_suffix(".won").write_text(" ".join(won))
    while not me.with_name("end").exists():  # hold the claims until every racer has tried
        time.sleep(0.01)
"""


def test_sweeps_claiming_at_once_get_each_config_once(store_url, tmp_path):
    configs = [f"{i:016x}" for i in range(20)]
    ResultStore(store_url).bind_gpu("NVIDIA H200")  # the tables; their creation racing is tested above
    racers = start_together([[sys.executable, "-c", CLAIMER, store_url, str(tmp_path / f"racer{i}"), *configs]
                             for i in range(4)], tmp_path)
    wait_for_files(tmp_path, "*.won", len(racers), time.monotonic() + 120)
    (tmp_path / "end").touch()
    errors = [r.communicate(timeout=120)[1] for r in racers]
    assert [r.returncode for r in racers] == [0] * len(racers), "\n".join(errors)
    won = [h for path in tmp_path.glob("*.won") for h in path.read_text().split()]
    assert sorted(won) == configs  # every config claimed, none by two sweeps


def test_a_store_lost_during_a_run_does_not_hide_why_the_run_ended(tmp_path):
    import shutil

    store = ResultStore(f"sqlite:///{tmp_path / 'lost' / 'store.sqlite'}")
    with pytest.raises(KeyboardInterrupt):
        with store.running("run-a"):
            shutil.rmtree(tmp_path / "lost")
            store.engine.dispose()
            raise KeyboardInterrupt


FUSED = dataclasses.replace(P, epilogue=Epilogue(bias=True, activation=Activation.SILU))
FP8_ROWCOL = Problem(4096, 4096, 4096, dtype_a=DType.E4M3, dtype_b=DType.E4M3, scaling=Scaling.ROWCOL)


def test_fused_problems_fill_the_epilogue_and_scaling_columns(store_url):
    # Guards against rows of fused problems stored under the schema-2 columns' default 'none'.
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    for problem in (P, FUSED, FP8_ROWCOL):
        store.add(dataclasses.replace(ok(V1, 700.0), problem=problem), gpu="NVIDIA H200", run_id="r1")
    rows = store.rows(["problem", "epilogue", "scaling"])
    assert [(r.epilogue, r.scaling) for r in rows] == [("none", "none"), ("bias+silu", "none"), ("none", "rowcol")]
    assert rows[1].problem.endswith("_bias+silu") and rows[2].problem.endswith("_scale-rowcol")
    assert [m.problem for m in store.measurements()] == [P, FUSED, FP8_ROWCOL]


def test_an_eager_baseline_row_keeps_its_torch_compile_figures(store_url):
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    eager = Measurement(problem=FUSED, config=None, runtime=V1, status=Status.OK, symbol="torch eager",
                        is_baseline=True, median_ms=0.30, p20_ms=0.29, p80_ms=0.31, samples=50,
                        tflops=FUSED.flops / 0.30e9, compile_median_ms=0.25, compile_p20_ms=0.24,
                        compile_p80_ms=0.26)
    store.add(eager, gpu="NVIDIA H200", run_id="r1")
    kernel = dataclasses.replace(ok(V1, 700.0), problem=FUSED, baseline_median_ms=0.30)
    store.add(kernel, gpu="NVIDIA H200", run_id="r1")
    rows = store.rows(["kernel", "ratio"])
    assert rows[0].kernel == "torch eager" and rows[1].kernel == CFG.name
    back = store.measurements()[0]
    assert back == eager and back.compile_ratio == pytest.approx(1.2)
    # The kernel's ratio to eager is its paired one; to torch.compile, through the eager row.
    assert rows[1].ratio == pytest.approx(kernel.paired_ratio)
    assert back.to_compile(rows[1].ratio) == pytest.approx(0.25 / kernel.median_ms)


def test_add_all_writes_every_measurement_or_none(store_url, monkeypatch):
    """Guards tune-model's record of a run's in-model figures: a write failing midway (here the
    database refusing the second row) leaves none of its rows."""
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    store.add(ok(V1, 600.0), gpu="NVIDIA H200", run_id="sweep")
    store.add_all([ok(V1, 700.0), ok(V2, 710.0)], gpu="NVIDIA H200", run_id="tuned", study="tune-model")
    assert [(r.run_id, r.study) for r in store.rows()] == [("sweep", None), ("tuned", "tune-model"),
                                                          ("tuned", "tune-model")]
    real = _sql.ResultStore._row

    def refused_second(m, **kwargs):
        row = real(m, **kwargs)
        return {**row, "status": None} if m.runtime == V2 else row  # NOT NULL: the database refuses it

    monkeypatch.setattr(_sql.ResultStore, "_row", staticmethod(refused_second))
    with pytest.raises(StoreError) as err:
        store.add_all([ok(V1, 720.0), ok(V2, 730.0)], gpu="NVIDIA H200", run_id="broken", study="tune-model")
    assert "\n" not in str(err.value)
    assert [r.run_id for r in store.rows()] == ["sweep", "tuned", "tuned"]
