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
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from ..errors import first_line
from ._errors import StoreError

SCHEMA_VERSION = 2
"""The schema this version writes: revision `schema<SCHEMA_VERSION>` of `migrations/`."""
OLDEST_READ = 1
"""The oldest schema this version reads as it is; an older store must be upgraded first."""
VERSION_TABLE = "ct_alembic_version"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
LOCK_KEY = 0x63745F6D69677261  # "ct_migra": the PostgreSQL advisory lock of a store's upgrade
LOCK_WAIT_MS = 120_000
"""How long an upgrade waits for another process's upgrade (or, on SQLite, any write) to end."""

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
    newer = found.isdigit() and int(found) > SCHEMA_VERSION
    return StoreError(f"the store {shown} has schema {found:.40}, this version reads {OLDEST_READ} to "
                      f"{SCHEMA_VERSION}" + (": upgrade cutlass-tune to use it" if newer else ""))


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
    if schema is None or schema > SCHEMA_VERSION:
        raise _unread(shown, recorded if recorded and recorded.isdigit() else ", ".join(revisions) or "none")
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
        waited = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
        conn.rollback()
        raw.isolation_level = None
        try:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {LOCK_WAIT_MS}")
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        finally:
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
