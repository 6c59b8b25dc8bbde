"""A store's schema version, read without writing, and its upgrade by Alembic migrations.

The migrations live in `migrations/` beside this module (shipped in the wheel): one revision
per schema, `schema1` (the tables as the versions before migrations made them) to
`schema<SCHEMA_VERSION>`. A store records its revision in `ct_alembic_version` (Optuna keeps
its own in `alembic_version`, in the same database); one begun before migrations records none
and is schema 1. `ct_meta`'s `schema` follows the revision, for versions that read only it.

An upgrade runs in one transaction that holds the store's migration lock (SQLite's write lock
taken at BEGIN IMMEDIATE; a PostgreSQL advisory lock): processes upgrading one store at once
wait for each other, and only the first migrates. SQLite and PostgreSQL both roll DDL back, so
a migration that fails leaves the store as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from ..errors import first_line
from ._errors import StoreError
from ._sqlite import InterruptibleConnection

SCHEMA_VERSION = 3
"""The schema this version writes: revision `schema<SCHEMA_VERSION>` of `migrations/`."""
OLDEST_READ = 1
"""The oldest schema this version reads as it is; an older store must be upgraded first."""
VERSION_TABLE = "ct_alembic_version"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
LOCK_KEY = 0x63745F6D69677261  # "ct_migra": the PostgreSQL advisory lock of a store's upgrade
LOCK_WAIT_MS = 120_000
"""How long an upgrade waits for another process's upgrade (or, on SQLite, any write) to end."""

STUDY_METRIC = "TFLOP/s"
"""The name of a study's value: a config's best TFLOP/s over its run-time variants on the problem."""
STUDY_CONSTRAINT = "invalid"
"""A study's constraint name: 1 for an invalid config (infeasible), 0 for a valid one."""

_version = sa.table(VERSION_TABLE, sa.column("version_num", sa.String))
_meta = sa.table("ct_meta", sa.column("key", sa.String), sa.column("value", sa.Text))


def revision_of(schema: int) -> str:
    """The Alembic revision of schema `schema` (`schema2` for 2)."""
    return f"schema{schema}"


def _schema_of(revision: str) -> int | None:
    number = revision.removeprefix("schema")
    if revision.startswith("schema") and number.isdigit() and revision == revision_of(int(number)):
        return int(number)
    return None


def _unread(shown: str, found: str) -> StoreError:
    """The error for a store whose schema (or revision) `found` this version does not read."""
    if found.isdigit() and int(found) > SCHEMA_VERSION:
        return StoreError(f"the store {shown} has schema {found:.40}, this version reads {OLDEST_READ} to "
                          f"{SCHEMA_VERSION}: upgrade cutlass-tune to use it")
    # Not "has schema 1, this version reads 1 to 2": what it records is no schema a version wrote.
    return StoreError(f"the store {shown} records the schema {found!r:.40}, which no version of cutlass-tune "
                      f"wrote (this one reads {OLDEST_READ} to {SCHEMA_VERSION}): it is damaged or of a newer "
                      "cutlass-tune")


def stored_schema(conn: sa.Connection, shown: str) -> int | None:
    """The schema version of the store on `conn`: None where it has no measurements table yet
    (a new store). Reads, never writes.

    Raises:
        StoreError: the store is of a newer schema than this version reads, or records one
            no version wrote (naming both).
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    tables = set(sa.inspect(conn).get_table_names())
    if "ct_measurements" not in tables:
        if VERSION_TABLE in tables:
            raise StoreError(f"the store {shown} is damaged: it has no ct_measurements table")
        return None
    recorded = conn.execute(sa.select(_meta.c.value).where(_meta.c.key == "schema")).scalar() \
        if "ct_meta" in tables else None
    if VERSION_TABLE not in tables:  # begun before migrations
        if recorded in (None, "1"):
            return 1
        raise _unread(shown, recorded)
    revisions = conn.execute(sa.select(_version.c.version_num)).scalars().all()
    schema = _schema_of(revisions[0]) if len(revisions) == 1 else None
    if schema is None or schema > SCHEMA_VERSION:  # the revision says which schema, not ct_meta's copy
        raise _unread(shown, str(schema) if schema is not None else ", ".join(revisions) or "none")
    return schema


@contextlib.contextmanager
def _locked(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction that holds the store's migration lock until it commits
    (on leaving the block) or rolls back (on an exception)."""
    with engine.connect() as conn:
        if engine.dialect.name != "sqlite":
            with conn.begin():
                if engine.dialect.name == "postgresql":
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {LOCK_WAIT_MS}")
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(LOCK_KEY)))
                yield conn
            return
        # pysqlite begins a transaction only before a row is written, so DDL would commit
        # statement by statement: take the transaction (and the write lock) ourselves.
        raw = conn.connection.dbapi_connection
        assert raw is not None, "a connection checked out of the pool"
        level = raw.isolation_level
        sliced = isinstance(raw, InterruptibleConnection)  # waits in Python, a Ctrl-C stopping it
        waited = raw.wait_s if sliced else conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
        conn.rollback()
        raw.isolation_level = None
        try:
            if sliced:
                raw.wait_s = LOCK_WAIT_MS / 1000
            else:
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {LOCK_WAIT_MS}")
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        finally:
            if sliced:
                raw.wait_s = waited
            else:
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(waited or 0)}")
            conn.rollback()
            raw.isolation_level = level


def _migrate(conn: sa.Connection) -> None:
    # Alembic, imported here: reading a store (best, dashboard) does not need its 100 ms.
    from alembic import command
    from alembic.config import Config

    config = Config(attributes={"connection": conn})
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    command.upgrade(config, revision_of(SCHEMA_VERSION))


def upgrade(engine: sa.Engine, shown: str, *, create: bool) -> int | None:
    """Bring the store to `SCHEMA_VERSION`, once, however many processes try at once.

    Args:
        create: make a new store's tables; else a new store is left as it is.

    Returns:
        The schema the store had before (`SCHEMA_VERSION` where it had it already; None for a
        new store).

    Raises:
        StoreError: the store is of a newer schema, or a migration failed (the store is left
            as it was); both in one line.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    with engine.connect() as conn:
        before = stored_schema(conn, shown)
    if before == SCHEMA_VERSION or (before is None and not create):
        return before
    try:
        with _locked(engine) as conn:
            before = stored_schema(conn, shown)  # again: another process may have upgraded it meanwhile
            if before != SCHEMA_VERSION:
                _migrate(conn)
    except StoreError:
        raise
    except Exception as err:  # SQLAlchemy's, Alembic's, or a migration's own
        what = f"make the tables of {shown}" if before is None else (
            f"upgrade the store {shown} from schema {before} to {SCHEMA_VERSION}")
        raise StoreError(f"cannot {what} (left as it was): {first_line(err)}") from err
    return before


@dataclasses.dataclass(frozen=True)
class TrialsConverted:
    """What `convert_trials` changed in a store's Optuna studies."""

    pruned: int = 0
    """Trials of invalid configs kept COMPLETE at 0 TFLOP/s, now PRUNED (as sweeps record them)."""
    failed: int = 0
    """Other trials kept COMPLETE at 0 (no kernel ran at 0 TFLOP/s), now FAIL."""
    named: int = 0
    """Studies whose unnamed metric got its name."""
    explained: int = 0
    """Trials that did not complete (or are converted) without a `reason`, now with one saying that
    none was kept."""

    def __bool__(self) -> bool:
        return bool(self.pruned or self.failed or self.named or self.explained)


_OPTUNA_TABLES = ("studies", "trials", "trial_values", "trial_user_attributes", "trial_system_attributes",
                  "study_system_attributes")
_METRIC_NAMES = "study:metric_names"  # Optuna's key (optuna.study.study._SYSTEM_ATTR_METRIC_NAMES)
_CONSTRAINTS = "constraints"  # Optuna < 5 kept a trial's constraints as one list under this key
NO_REASON = "no reason recorded (the sweep that wrote this trial kept none)"


def _invalid(attrs: dict[str, str], name: str) -> bool:
    """Whether a trial's system attributes mark it infeasible under the constraint `name` (Optuna 5
    keeps each constraint under `constraints:<name>`, earlier versions all of them as one list)."""
    try:
        if f"{_CONSTRAINTS}:{name}" in attrs:
            return float(json.loads(attrs[f"{_CONSTRAINTS}:{name}"])) > 0
        listed = json.loads(attrs.get(_CONSTRAINTS, "[]"))
        return bool(listed) and float(listed[0]) > 0
    except (ValueError, TypeError, IndexError):
        return False


def convert_trials(engine: sa.Engine, shown: str) -> TrialsConverted:
    """Bring a store's Optuna trials to what this version writes, once (a second call changes
    nothing). Sweeps before it told an invalid config (never compiled) as a COMPLETE trial of
    value 0.0 and left the study's metric unnamed, so generic tools (optuna-dashboard,
    optuna.visualization) plotted every invalid proposal at 0 TFLOP/s. Each such trial becomes
    PRUNED without a value (a COMPLETE one at 0 that is not marked invalid becomes FAIL), keeping
    its `reason` user attribute; every FAIL or PRUNED trial without a `reason` (an interrupted
    sweep's) gets one saying that none was kept; and each study with an unnamed metric gets its
    name. Measurements and the schema are untouched, so every version
    that read the store still reads it. Runs in one transaction under the store's migration lock.

    Raises:
        StoreError: the conversion failed (the store is left as it was), in one line.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    if not set(_OPTUNA_TABLES) <= set(sa.inspect(engine).get_table_names()):
        return TrialsConverted()
    meta = sa.MetaData()
    t = {name: sa.Table(name, meta, autoload_with=engine) for name in _OPTUNA_TABLES}
    trials, values, user, system = t["trials"], t["trial_values"], t["trial_user_attributes"], \
        t["trial_system_attributes"]
    study_attrs = t["study_system_attributes"]
    try:
        with _locked(engine) as conn:
            def without_reason(states: tuple[str, ...]) -> list[int]:
                explained = sa.select(user.c.trial_id).where(user.c.key == "reason")
                return list(conn.execute(sa.select(trials.c.trial_id).where(
                    trials.c.state.in_(states), trials.c.trial_id.not_in(explained))).scalars())

            # Every trial that did not complete says why: an interrupted sweep's kept no reason.
            silent = without_reason(("FAIL", "PRUNED"))
            zero = conn.execute(sa.select(trials.c.trial_id).join(values, values.c.trial_id == trials.c.trial_id)
                                .where(trials.c.state == "COMPLETE", values.c.objective == 0,
                                       values.c.value == 0.0)).scalars().all()
            silent += [i for i in without_reason(("COMPLETE",)) if i in set(zero)]
            pruned = failed = 0
            for trial_id in zero:
                attrs = dict(conn.execute(sa.select(system.c.key, system.c.value_json)
                                          .where(system.c.trial_id == trial_id)).all())
                invalid = _invalid(attrs, STUDY_CONSTRAINT)
                pruned, failed = pruned + invalid, failed + (not invalid)
                conn.execute(trials.update().where(trials.c.trial_id == trial_id)
                             .values(state="PRUNED" if invalid else "FAIL"))
                conn.execute(values.delete().where(values.c.trial_id == trial_id))
            for trial_id in silent:
                conn.execute(user.insert().values(trial_id=trial_id, key="reason", value_json=json.dumps(NO_REASON)))
            named_already = set(conn.execute(sa.select(study_attrs.c.study_id)
                                             .where(study_attrs.c.key == _METRIC_NAMES)).scalars())
            unnamed = [s for s in conn.execute(sa.select(t["studies"].c.study_id)).scalars() if s not in named_already]
            for study_id in unnamed:
                conn.execute(study_attrs.insert().values(study_id=study_id, key=_METRIC_NAMES,
                                                         value_json=json.dumps([STUDY_METRIC])))
    except StoreError:
        raise
    except Exception as err:  # SQLAlchemy's, or a damaged attribute's
        raise StoreError(f"cannot convert the Optuna trials of {shown} (left as they were): {first_line(err)}") from err
    return TrialsConverted(pruned=pruned, failed=failed, named=len(unnamed), explained=len(silent))
