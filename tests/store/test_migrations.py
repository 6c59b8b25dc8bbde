"""Stores of older schemas: read as they are, upgraded once by the first writer, on every backend."""

import fnmatch
import shutil
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

import cutlass_tune
from cutlass_tune.measurement import Measurement, TimingScheme
from cutlass_tune.space import KernelConfig, Problem, RuntimeArgs
from cutlass_tune.status import Status
from cutlass_tune.store import SCHEMA_VERSION, ResultStore, StoreError, _migrate, _sql

from .. import cli_run
from ..racing import start_together, wait_for_files

ROOT = Path(__file__).resolve().parents[2]
SCHEMA1 = Path(__file__).resolve().parent / "data" / "store-schema1.sqlite"
"""A store as the last version before migrations wrote it (tests/store/data/README.md)."""
SCHEMA1_ROWS = 26
OURS = ("ct_meta", "ct_measurements", "ct_runs", "ct_claims")


@pytest.fixture
def schema1_url(store_url, tmp_path):
    """The schema-1 store on each backend: the committed SQLite file, or its tables (reflected
    from it) and rows copied to PostgreSQL beside Optuna's tables and its own alembic_version."""
    source = tmp_path / "schema1.sqlite"
    shutil.copy(SCHEMA1, source)
    if store_url.startswith("sqlite"):
        return f"sqlite:///{source}"
    import optuna

    tables = sa.MetaData()
    reader, writer = sa.create_engine(f"sqlite:///{source}"), sa.create_engine(store_url)
    tables.reflect(reader, only=OURS)
    tables.create_all(writer)
    with reader.connect() as src, writer.begin() as dst:
        for table in tables.sorted_tables:
            rows = [r._asdict() for r in src.execute(sa.select(table))]
            if rows:
                dst.execute(table.insert(), rows)
        dst.execute(sa.text("SELECT setval(pg_get_serial_sequence('ct_measurements', 'id'), "
                            "(SELECT max(id) FROM ct_measurements))"))
    reader.dispose(), writer.dispose()
    optuna.storages.RDBStorage(store_url)
    return store_url


def _file(url):
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


def _state(url):
    """What reading must not change: each table's columns and indexes, the recorded schema
    and revisions, the rows; for a SQLite file also its bytes and modification time."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        names = sorted(inspector.get_table_names())
        shape = {t: ([(c["name"], str(c["type"]), c["nullable"], str(c["default"])) for c in inspector.get_columns(t)],
                     sorted(i["name"] or "" for i in inspector.get_indexes(t))) for t in names}
        with engine.connect() as conn:
            rows = {t: conn.execute(sa.text(f"SELECT * FROM {t}")).all()
                    for t in (*OURS, "alembic_version", _migrate.VERSION_TABLE) if t in names}
    finally:
        engine.dispose()
    path = _file(url)
    on_disk = (path.read_bytes(), path.stat().st_mtime_ns) if path else None
    return shape, rows, on_disk


def _revisions(url):
    """The store's revisions, its `ct_meta` schema and Optuna's revisions."""
    engine = sa.create_engine(url)
    ours = f"SELECT version_num FROM {_migrate.VERSION_TABLE}"
    try:
        with engine.connect() as conn:
            return (conn.execute(sa.text(ours)).scalars().all() if sa.inspect(conn).has_table(_migrate.VERSION_TABLE)
                    else [],
                    conn.execute(sa.text("SELECT value FROM ct_meta WHERE key = 'schema'")).scalar(),
                    conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all())
    finally:
        engine.dispose()


def cli(*args):
    return cli_run.cli(*args, cwd=Path.cwd())  # in this process: the commands' output and exit codes


def test_a_store_from_before_migrations_is_read_as_it_is(schema1_url):
    # Guards against a reader (best, dashboard, load_best) upgrading or otherwise writing to the store it reads.
    before = _state(schema1_url)
    time.sleep(0.01)  # a write would show in the modification time
    store = ResultStore(schema1_url)
    assert store.schema() == 1 and store.gpu() == "NVIDIA H200"
    assert store.timing() == TimingScheme.parse("events-paired")
    store.check_schema()
    rows = store.rows()
    assert len(rows) == len(store.measurements()) == SCHEMA1_ROWS
    assert {(r.epilogue, r.scaling) for r in rows} == {("none", "none")}  # columns it lacks, as their default
    assert store.rows(["epilogue"])[0].epilogue == "none"
    assert {r.regime for r in rows} == {"sustained"}  # a store from before regimes reads as sustained-only
    assert store.measured(Problem(4096, 4096, 4096))
    assert len(cutlass_tune.load_best(schema1_url)) == 2
    assert len(cutlass_tune.BestTable.load(schema1_url).frame) == 2
    assert _state(schema1_url) == before


@pytest.mark.parametrize("command", [["best"], ["best", "--format", "csv"], ["dashboard", "-o", "{tmp}/d.html"]])
def test_reading_commands_write_nothing_to_a_store_from_before_migrations(command, tmp_path):
    path = tmp_path / "s.sqlite"
    shutil.copy(SCHEMA1, path)
    before = _state(f"sqlite:///{path}")
    done = cli(*(a.format(tmp=tmp_path) for a in command), "--storage", path)
    assert done.returncode == 0, done.stderr
    assert _state(f"sqlite:///{path}") == before


def test_a_writer_upgrades_it_keeping_every_row(schema1_url):
    old = ResultStore(schema1_url)
    rows = old.rows([c.name for c in _sql.measurements_table.c])
    optuna_revision = _revisions(schema1_url)[2]
    store = ResultStore(schema1_url)
    store.bind_gpu("NVIDIA H200")  # what sweep and confirm do first
    assert store.schema() == SCHEMA_VERSION == 3
    assert store.rows([c.name for c in _sql.measurements_table.c]) == rows
    assert _revisions(schema1_url) == (["schema3"], "3", optuna_revision)  # Optuna's own revision untouched
    p = Problem(4096, 4096, 4096)
    store.add(Measurement(problem=p, config=KernelConfig(), runtime=RuntimeArgs(), status=Status.OK, tflops=700.0,
                          median_ms=p.flops / 7e14, samples=10, regime="idle-gap:200us"), gpu="NVIDIA H200",
              run_id="after")
    added = store.rows()[-1]
    assert (added.id, added.run_id, added.epilogue, added.scaling) == (SCHEMA1_ROWS + 1, "after", "none", "none")
    assert added.regime == "idle-gap:200us" and {r.regime for r in store.rows()[:-1]} == {"sustained"}
    assert ResultStore(schema1_url).upgrade() == SCHEMA_VERSION  # already: nothing more to do


def test_its_optuna_studies_still_load_after_the_upgrade(tmp_path):
    import optuna

    path = tmp_path / "s.sqlite"
    shutil.copy(SCHEMA1, path)
    url = f"sqlite:///{path}"
    names = sorted(optuna.study.get_all_study_names(url))
    assert ResultStore(url).upgrade() == 1
    storage = _sql.open_study_storage(url)
    assert sorted(optuna.study.get_all_study_names(storage)) == names and len(names) == 2
    assert all(optuna.load_study(study_name=n, storage=storage).trials for n in names)


def test_the_upgrade_command(schema1_url, tmp_path):
    rows = len(ResultStore(schema1_url).rows())
    done = cli("upgrade", "--storage", schema1_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"upgraded the store {schema1_url} from schema 1 to {SCHEMA_VERSION}"
    done = cli("upgrade", "--storage", schema1_url)
    assert done.stdout.strip() == f"the store {schema1_url} is at schema {SCHEMA_VERSION} already"
    assert len(ResultStore(schema1_url).rows()) == rows
    missing = tmp_path / "none" / "s.sqlite"
    done = cli("upgrade", "--storage", missing)
    assert (done.returncode, done.stderr) == (2, f"error: no store at sqlite:///{missing}\n")
    assert not missing.parent.exists()


def test_a_store_of_a_newer_schema_is_refused_in_one_line(store_url):
    # Guards against this version reading (or writing) a store whose tables a later version changed.
    ResultStore(store_url).bind_gpu("NVIDIA H200")
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {_migrate.VERSION_TABLE} SET version_num = 'schema{SCHEMA_VERSION + 1}'"))
        conn.execute(sa.text(f"UPDATE ct_meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema'"))
    engine.dispose()
    before = _state(store_url)
    message = (f"the store {ResultStore(store_url).shown} has schema {SCHEMA_VERSION + 1}, this version reads 1 to "
               f"{SCHEMA_VERSION}: "
               "upgrade cutlass-tune to use it")
    for call in (lambda s: s.rows(), lambda s: s.gpu(), lambda s: s.check_schema(), lambda s: s.schema(),
                 lambda s: s.bind_gpu("NVIDIA H200"), lambda s: s.upgrade(), lambda s: s.running("r").__enter__()):
        with pytest.raises(StoreError) as info:
            call(ResultStore(store_url))
        assert str(info.value) == message
    for command in (["best"], ["upgrade"]):
        done = cli(*command, "--storage", store_url)
        assert (done.returncode, done.stderr) == (2, f"error: {message}\n")
    assert _state(store_url) == before


@pytest.mark.parametrize(("revision", "said"), [
    (f"schema{SCHEMA_VERSION + 1}", f"has schema {SCHEMA_VERSION + 1}, this version reads 1 to {SCHEMA_VERSION}: "),
    ("a1b2c3", "records the schema 'a1b2c3', which no version")])
def test_a_newer_revision_is_named_not_the_schema_ct_meta_still_records(revision, said, tmp_path):
    """Guards against a store of a future schema whose ct_meta still said 1 reading "has schema 1, this
    version reads 1 to 2"."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    ResultStore(url).bind_gpu("NVIDIA H200")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {_migrate.VERSION_TABLE} SET version_num = '{revision}'"))
        conn.execute(sa.text("UPDATE ct_meta SET value = '1' WHERE key = 'schema'"))
    engine.dispose()
    with pytest.raises(StoreError) as info:
        ResultStore(url).rows()
    assert said in str(info.value) and "has schema 1" not in str(info.value)


def test_a_store_older_than_this_version_reads_is_refused_naming_the_upgrade(schema1_url, monkeypatch):
    # The rule for a schema no reader of this version reads as it is (none yet: OLDEST_READ is 1).
    monkeypatch.setattr(_sql, "OLDEST_READ", 2)
    with pytest.raises(StoreError, match=rf"has schema 1, this version reads 2 to {SCHEMA_VERSION}: run "
                                         r"`cutlass-tune upgrade "
                                         r"--storage .*` first$"):
        ResultStore(schema1_url).rows()
    assert ResultStore(schema1_url).upgrade() == 1
    assert len(ResultStore(schema1_url).rows()) == SCHEMA1_ROWS


def test_a_migration_failing_midway_leaves_the_store_as_it_was(schema1_url):
    # Guards against a half-upgraded store: one column added, the other and the revision not.
    before = _state(schema1_url)

    def fail(conn, cursor, statement, *args):
        if "ADD COLUMN scaling" in statement:  # after `epilogue` was added
            raise RuntimeError("planted failure")

    sa.event.listen(sa.Engine, "before_cursor_execute", fail)
    try:
        with pytest.raises(StoreError) as info:
            ResultStore(schema1_url).bind_gpu("NVIDIA H200")
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", fail)
    assert str(info.value) == (f"cannot upgrade the store {ResultStore(schema1_url).shown} from schema 1 to "
                               f"{SCHEMA_VERSION} "
                               "(left as it was): planted failure")
    assert _state(schema1_url) == before
    assert ResultStore(schema1_url).upgrade() == 1  # and the next try does it whole


UPGRADER = """
import pathlib, sys, time
from cutlass_tune.store import ResultStore
url, me = sys.argv[1], pathlib.Path(sys.argv[2])
store = ResultStore(url)
me.with_suffix(".ready").touch()
while not me.with_name("go").exists():
    time.sleep(0.001)
me.with_suffix(".done").write_text(str(store.upgrade()))
"""


def test_upgrades_at_once_end_at_the_head_once(schema1_url, tmp_path):
    racers = start_together([[sys.executable, "-c", UPGRADER, schema1_url, str(tmp_path / f"racer{i}")]
                             for i in range(4)], tmp_path)
    errors = [r.communicate(timeout=120)[1] for r in racers]
    assert [r.returncode for r in racers] == [0] * len(racers), "\n".join(errors)
    wait_for_files(tmp_path, "*.done", len(racers), time.monotonic() + 10)
    befores = sorted(p.read_text() for p in tmp_path.glob("*.done"))
    assert befores == ["1", "3", "3", "3"]  # one migrated; the others found it done
    assert _revisions(schema1_url)[:2] == (["schema3"], "3")
    assert len(ResultStore(schema1_url).rows()) == SCHEMA1_ROWS


def _shape(engine, schema=None):
    inspector = sa.inspect(engine)
    return {t: ([(c["name"], str(c["type"]), c["nullable"], str(c["default"]).replace(f"{schema}.", ""))
                 for c in inspector.get_columns(t, schema=schema)],
                sorted((i["name"], tuple(i["column_names"])) for i in inspector.get_indexes(t, schema=schema)))
            for t in OURS}


def _declared(url, tmp_path):
    """The shape of the tables the code declares (`_sql._metadata`), made beside `url`'s: in a
    file of their own for SQLite, in a PostgreSQL schema of their own in its database."""
    sqlite = url.startswith("sqlite")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'declared.sqlite'}" if sqlite else url)
    schema = None if sqlite else "declared"
    try:
        with engine.begin() as conn:
            if schema:
                conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
            _sql._metadata.create_all(conn.execution_options(schema_translate_map={None: schema}))
        return _shape(engine, schema)
    finally:
        engine.dispose()


def test_a_new_store_has_the_tables_the_code_declares(store_url, tmp_path):
    # Guards against a column added to the code's tables without its migration (or the reverse).
    store = ResultStore(store_url)
    store.bind_gpu("NVIDIA H200")
    assert _shape(store.engine) == _declared(store_url, tmp_path)


def test_an_upgraded_store_has_the_tables_the_code_declares(schema1_url, tmp_path):
    store = ResultStore(schema1_url)
    store.upgrade()
    assert _shape(store.engine) == _declared(schema1_url, tmp_path)


def test_the_revisions_are_the_schemas_in_order():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(_migrate.MIGRATIONS))
    script = ScriptDirectory.from_config(config)
    chain = [r.revision for r in script.walk_revisions()][::-1]
    assert chain == [_migrate.revision_of(n) for n in range(1, SCHEMA_VERSION + 1)]
    assert script.get_current_head() == _migrate.revision_of(SCHEMA_VERSION)


def test_every_migration_ships_in_the_wheel():
    # Guards against a migration the package data leaves out: an installed store could not be upgraded.
    tomllib = pytest.importorskip("tomllib")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "cutlass_tune.store"]
    package = ROOT / "cutlass_tune" / "store"
    files = [p.relative_to(package).as_posix() for p in _migrate.MIGRATIONS.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)


COMMITTED_OLD_TRIALS = ROOT / "results" / "quick-nvidia-h200.sqlite"


def _trials(url):
    """Each study's metric names and its trials' (state, value, reason, invalid constraint)."""
    import optuna

    storage = _sql.open_study_storage(url)
    out = {}
    for name in optuna.study.get_all_study_names(storage):
        study = optuna.load_study(study_name=name, storage=storage)
        out[name] = (study.metric_names, [(t.state.name, t.value, t.user_attrs.get("reason"),
                                           (t.constraints or {}).get("invalid")) for t in study.trials])
    return out


def _old_trials_store(tmp_path):
    """A store whose studies keep invalid configs as COMPLETE trials at 0.0 with unnamed metrics, as
    sweeps before PRUNED trials wrote them: a copy of a committed one, or one built so where the
    committed stores are all converted."""
    import optuna

    path = tmp_path / "old.sqlite"
    shutil.copy(COMMITTED_OLD_TRIALS, path)
    url = f"sqlite:///{path}"
    if any(state == "COMPLETE" and value == 0.0 for _, trials in _trials(url).values() for state, value, *_ in trials):
        return url
    study = optuna.create_study(study_name="old", storage=url, direction="maximize")
    dist = {"tile_n": optuna.distributions.CategoricalDistribution(["128", "256"])}
    for value, invalid, reason in ((0.0, 1.0, "smem_capacity: too big"), (0.0, 1.0, None), (650.0, 0.0, None)):
        study.add_trial(optuna.trial.create_trial(params={"tile_n": "256"}, distributions=dist, value=value,
                                                  user_attrs={"reason": reason} if reason else {},
                                                  constraints={"invalid": invalid}))
    return url


def test_upgrade_converts_invalid_trials_kept_complete_at_zero(tmp_path):
    """Guards the upgrade of stores whose invalid configs optuna-dashboard plotted at 0 TFLOP/s."""
    from cutlass_tune.search._samplers import METRIC

    url = _old_trials_store(tmp_path)
    before = _trials(url)
    rows = len(ResultStore(url).rows())
    zero = sum(1 for _, trials in before.values() for state, value, *_ in trials if state == "COMPLETE" and not value)
    assert zero > 0 and any(names != [METRIC] for names, _ in before.values())
    done = cli("upgrade", "--storage", url)
    assert done.returncode == 0, done.stderr
    assert f"converted its Optuna trials: {zero} of invalid configs from COMPLETE at 0 to PRUNED" in done.stdout
    after = _trials(url)
    assert after.keys() == before.keys()
    for name, (names, trials) in after.items():
        assert names == [METRIC]
        assert len(trials) == len(before[name][1])
        for old, new in zip(before[name][1], trials):
            if old[0] == "COMPLETE" and not old[1]:  # each invalid config: pruned, no value, its reason kept
                assert new[:2] == ("PRUNED", None) and new[3] == 1.0
                assert new[2] == (old[2] or _migrate.NO_REASON)
            else:
                assert new == old
    assert len(ResultStore(url).rows()) == rows
    again = cli("upgrade", "--storage", url)
    assert again.returncode == 0 and "converted" not in again.stdout  # once: nothing left to convert


def test_converting_trials_leaves_the_schema_for_older_readers(tmp_path):
    # The schema stays as it was: versions that read the store before still read it (benchmarks/store_migrations.md).
    url = _old_trials_store(tmp_path)
    store = ResultStore(url)
    schema, revisions = store.schema(), _revisions(url)
    converted = cutlass_tune.store.convert_trials(store.engine, store.shown)
    assert converted.pruned > 0 and converted.failed == 0
    assert (store.schema(), _revisions(url)) == (schema, revisions)
    assert not cutlass_tune.store.convert_trials(store.engine, store.shown)


def test_a_trial_complete_at_zero_not_marked_invalid_becomes_a_failure(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    ResultStore(url).bind_gpu("NVIDIA H200")
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    dist = {"tile_n": optuna.distributions.CategoricalDistribution(["128"])}
    study.add_trial(optuna.trial.create_trial(params={"tile_n": "128"}, distributions=dist, value=0.0))
    store = ResultStore(url)
    assert cutlass_tune.store.convert_trials(store.engine, store.shown) == \
        cutlass_tune.store.TrialsConverted(pruned=0, failed=1, named=1, explained=1)
    assert _trials(url)["s"][1] == [("FAIL", None, _migrate.NO_REASON, None)]


def test_every_committed_store_holds_its_trials_as_this_version_writes_them():
    """Guards the committed stores against invalid configs kept as COMPLETE trials at 0 and unnamed metrics."""
    from cutlass_tune.search._samplers import METRIC

    for path in sorted((ROOT / "results").glob("*.sqlite")):
        for name, (names, trials) in _trials(f"sqlite:///{path}").items():
            assert names == [METRIC], (path.name, name)
            assert not [t for t in trials if t[0] == "COMPLETE" and not t[1]], (path.name, name)
            assert all(t[2] for t in trials if t[0] in ("PRUNED", "FAIL")), (path.name, name)


SCHEMA2_MOE = ROOT / "benchmarks" / "results" / "session_20261127c" / "h200_moe_suite" / "moe-suite.sqlite.gz"


def test_a_schema2_store_reads_as_sustained_only_and_upgrades_to_regimes(tmp_path):
    """A committed store of schema 2 (MoE suite, confirmed sustained): read as it is, every row is
    back to back; upgraded, it gains the regime column and keeps every row."""
    import gzip

    path = tmp_path / "moe.sqlite"
    path.write_bytes(gzip.decompress(SCHEMA2_MOE.read_bytes()))
    url = f"sqlite:///{path}"
    store = ResultStore(url)
    assert store.schema() == 2
    rows = store.rows()
    assert {r.regime for r in rows} == {"sustained"}
    best = cutlass_tune.load_best(url)
    confirmed = best[best["confirm_passes"] > 0]
    assert len(confirmed) and set(confirmed["sustained_regime"]) == {"sustained"}
    assert (confirmed["sustained_ratio"] == confirmed["ratio"]).all()
    assert set(best["idle_gap_regime"]) == {""} and best["call_site_ratio"].isna().all()
    assert store.upgrade() == 2 and ResultStore(url).schema() == SCHEMA_VERSION
    assert ResultStore(url).rows() == rows
