"""The results store: every measurement of every sweep, in SQLite (default) or PostgreSQL.

One SQLAlchemy implementation serves both; Optuna keeps its studies in the same database
through its own RDB storage. Each measurement is committed on its own, so a killed process
loses at most those in flight (one per GPU it measures on). A store belongs to one GPU model: opening it for another
raises `StoreGpuMismatchError` instead of mixing results silently.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from .._files import why_unwritable
from ..errors import first_line
from ..measurement import Measurement, TimingMethod, TimingScheme
from ..regime import SUSTAINED
from ..space import Problem
from . import _migrate, _sqlite
from ._errors import StoreError, StoreGpuMismatchError
from ._migrate import OLDEST_READ, SCHEMA_VERSION
from ._row import DamagedRowError, StoredRow

if TYPE_CHECKING:
    import optuna

_CREATE_ATTEMPTS = 5
BUSY_TIMEOUT_S = 60.0
"""How long a SQLite write waits for another process's (pysqlite's own 5 s lost adds on a loaded host)."""
_LOCKED_ATTEMPTS = 20
"""How often a SQLite write that still found the database locked is tried (each waiting `BUSY_TIMEOUT_S`)."""
T = TypeVar("T")
LEGACY_TIMING = TimingScheme(TimingMethod.EVENTS)
"""The timing scheme of stores begun before `ct_meta` recorded one."""
CONFIRM_STUDY = "confirm"
"""The `study` of the rows `cutlass-tune confirm` adds (a sweep's rows carry their Optuna study's name)."""
TUNE_MODEL_STUDY = "tune-model"
"""The `study` of the rows `cutlass-tune tune-model --storage` adds: kernels timed inside a model's
step, regime `in-model:...` (`RegimeSpec.in_model`)."""
HEARTBEAT_S = 15.0
"""How often a running sweep says, in the store, that it is alive."""
STALE_AFTER_S = 120.0
"""A sweep silent this long is taken for dead and its claims for free (another host's sweep;
one on this host is dead as soon as its process is)."""

_metadata = sa.MetaData()

meta_table = sa.Table(
    "ct_meta", _metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

measurements_table = sa.Table(
    "ct_measurements", _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("gpu", sa.String(128), nullable=False),
    sa.Column("problem", sa.String(128), nullable=False, index=True),
    sa.Column("m", sa.Integer, nullable=False),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("k", sa.Integer, nullable=False),
    sa.Column("dtype_a", sa.String(8), nullable=False),
    sa.Column("dtype_b", sa.String(8), nullable=False),
    sa.Column("dtype_d", sa.String(8), nullable=False),
    sa.Column("layout", sa.String(2), nullable=False),
    sa.Column("kernel", sa.String(160), nullable=False),
    sa.Column("config_hash", sa.String(16), nullable=True, index=True),
    sa.Column("runtime", sa.String(64), nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("median_ms", sa.Float, nullable=True),
    sa.Column("p20_ms", sa.Float, nullable=True),
    sa.Column("p80_ms", sa.Float, nullable=True),
    sa.Column("samples", sa.Integer, nullable=False, default=0),
    sa.Column("tflops", sa.Float, nullable=True),
    sa.Column("cublas_tflops", sa.Float, nullable=True),
    sa.Column("ratio", sa.Float, nullable=True),
    sa.Column("compile_seconds", sa.Float, nullable=True),
    sa.Column("throttled", sa.Boolean, nullable=False, default=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("study", sa.String(256), nullable=True),
    sa.Column("trial", sa.Integer, nullable=True),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("record", sa.Text, nullable=False),  # Measurement.to_dict(), lossless
    # Schema 2: the problem's fused epilogue (`Epilogue.name`) and fp8 scaling; 'none' in rows before them.
    sa.Column("epilogue", sa.Text, nullable=False, server_default="none"),
    sa.Column("scaling", sa.Text, nullable=False, server_default="none"),
    # Schema 3: the timing regime (`RegimeSpec.name`); 'sustained' in rows before it.
    sa.Column("regime", sa.Text, nullable=False, server_default="sustained"),
)
"""The measurements as this version writes them. A store's tables are made and changed by the
migrations of `_migrate`, which hold to this (tests/store/test_migrations.py)."""

runs_table = sa.Table(
    "ct_runs", _metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),  # seconds since the epoch, the run's clock
)

claims_table = sa.Table(
    "ct_claims", _metadata,
    sa.Column("config_hash", sa.String(16), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
)


_PASSWORD = re.compile(r"(://[^/@:]*:).*@")
"""The password of a URL SQLAlchemy cannot parse: all up to the last '@', which may mask more than the
password (a '@' in the database's name) but never less (a raw '@' in the password)."""
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)
"""A password given in the query (`?password=`, libpq's `sslpassword=`), which psycopg takes too."""


def parse_url(url: str) -> sa.engine.URL:
    """`url` parsed by SQLAlchemy, its user part ending at the last '@' before the host: a
    password with a raw '@' (`u:p@ss@host`) is all password, where SQLAlchemy alone would take
    its tail for the host and print it in messages.

    Raises:
        sqlalchemy.exc.ArgumentError, ValueError: `url` does not parse (a port that is not a number).
    """
    parsed = sa.engine.make_url(url)
    if parsed.host and "@" in parsed.host:
        head, _, host = parsed.host.rpartition("@")
        if parsed.password is not None:
            return parsed.set(password=f"{parsed.password}@{head}", host=host)
        return parsed.set(username=f"{parsed.username or ''}@{head}", host=host)
    return parsed


def sqlite_url(path: str | Path) -> str:
    """The `sqlite:///` URL of the file `path`, its name quoted: `?`, `#` and `%` in a file name
    are the file's, not a query nor an escape."""
    return sa.engine.URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)


def shown_url(url: str) -> str:
    """`url` as a message prints it: its password masked, in the user part and in the query,
    whatever characters it holds, also where SQLAlchemy cannot parse it."""
    try:
        shown = parse_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        shown = _PASSWORD.sub(r"\1***@", url)
    return _QUERY_PASSWORD.sub(r"\1***", shown)


def read_error(shown: str, err: Exception) -> StoreError:
    """The `StoreError` that says what went wrong reading the store `shown` (a masked URL): the
    database's own message, one line, for what SQLAlchemy or a damaged row raised."""
    if isinstance(err, DamagedRowError):
        return StoreError(f"store {shown} is damaged: {err}")
    problem = first_line(getattr(err, "orig", None) or err)
    if isinstance(err, sa.exc.DatabaseError) and not isinstance(err, sa.exc.OperationalError):
        return StoreError(f"store {shown} is damaged: {problem}")  # not a database, malformed, a bad row
    return StoreError(f"cannot use the store {shown}: {problem}")  # locked, gone, refused


def _store_errors(method: Callable[..., T]) -> Callable[..., T]:
    """`method` of a `ResultStore`, raising a `StoreError` for every failure of the database
    under it (SQLAlchemy's errors, a row a column cannot hold), so no caller sees them."""

    @functools.wraps(method)
    def wrapper(self: ResultStore, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except (sa.exc.SQLAlchemyError, DamagedRowError) as err:
            raise read_error(self.shown, err) from err

    return wrapper


def database_file(url: sa.engine.URL) -> Path | None:
    """The file a SQLite URL's database is in; None for a server's database, an in-memory one
    or a `file:` URI."""
    name = url.database
    if url.get_backend_name() != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return None
    return Path(name)


def _locked(err: sa.exc.SQLAlchemyError) -> bool:
    """Whether `err` is SQLite's "database is locked" (or "is busy"): another writer held on too long."""
    return isinstance(err, sa.exc.OperationalError) and any(
        s in str(err.orig) for s in ("database is locked", "database is busy"))


def _despite_locks(write: Callable[[], T]) -> T:
    """Run `write` (one transaction), again where SQLite found the database locked past its busy
    timeout, up to `_LOCKED_ATTEMPTS` times: a write waits its turn instead of being lost."""
    for attempt in range(1, _LOCKED_ATTEMPTS + 1):
        try:
            return write()
        except sa.exc.OperationalError as err:
            if attempt == _LOCKED_ATTEMPTS or not _locked(err):
                raise
            time.sleep(random.uniform(0, min(1.0, 0.01 * 2 ** attempt)))  # jitter: writers that met stay apart
    raise AssertionError("unreachable")


def _meta_value(key: str) -> sa.Select:
    return sa.select(meta_table.c.value).where(meta_table.c.key == key)


def _scheme(text: str) -> TimingScheme:
    """The timing scheme `ct_meta` records; DamagedRowError for text no version wrote."""
    try:
        return TimingScheme.parse(text)
    except ValueError as err:
        raise DamagedRowError(f"ct_meta records the timing scheme {text!r:.40}, which no version wrote") from err


def _create_despite_racers(create: Callable[[], T], what: str) -> T:
    """Run `create`, which looks for tables and creates those missing. Processes that open a new
    store at once race between the look and the CREATE; a loser fails and tries again, finding
    more tables each time.

    Raises:
        StoreError: the tables still cannot be made after `_CREATE_ATTEMPTS` tries.
    """
    for attempt in range(1, _CREATE_ATTEMPTS + 1):
        try:
            return create()
        except sa.exc.SQLAlchemyError as err:
            if attempt == _CREATE_ATTEMPTS:
                raise StoreError(f"cannot create {what}: {first_line(err)}") from err
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def open_study_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage in the store at `url`, its tables created if need be, safely when
    several sweeps start on a new store at once (Optuna's own creation is not).

    Raises:
        StoreError: the tables cannot be made.
    """
    import optuna

    return _create_despite_racers(lambda: optuna.storages.RDBStorage(url), f"Optuna's tables in {shown_url(url)}")


def _alive(run: sa.Row | None, now: float) -> bool:
    """Whether the sweep of a `ct_runs` row still runs: it spoke within `STALE_AFTER_S` and, on
    this host, its process exists."""
    if run is None or now - run.heartbeat_at > STALE_AFTER_S:
        return False
    if run.host != socket.gethostname():
        return True
    try:
        os.kill(run.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class ResultStore:
    """Measurements of sweeps. Process-safe through the database; one GPU model per store.

    A store of an older schema is read as it is (columns it lacks read as their default) and
    upgraded by the first method that writes to it (`_migrate`); one of a newer schema is
    refused by every method.

    Args:
        url: SQLAlchemy URL, e.g. `sqlite:///results/x.sqlite` or `postgresql+psycopg://...`.
            A SQLite file's directory is created; nothing else is created until `bind_gpu`.

    Raises:
        StoreError: malformed URL, unknown driver, unreachable server, unreadable schema.
    """

    def __init__(self, url: str):
        self.url = url
        self.shown = shown_url(url)
        """The URL as messages print it (password masked)."""
        try:
            parsed = parse_url(url)
            if parsed.host != sa.engine.make_url(url).host:  # a raw '@' in the password: Optuna reads it so too
                self.url = parsed.render_as_string(hide_password=False)
        except (sa.exc.ArgumentError, ValueError) as err:  # ValueError: a port that is not a number
            raise StoreError(f"cannot parse storage URL {self.shown!r} ({first_line(err)}): expected e.g. "
                             "sqlite:///results/sweep.sqlite or postgresql+psycopg://user@host/db") from err
        # A new SQLite file (and its folder) is made by the first write, not here: a command
        # that stops before writing (no GPU, bad input) leaves nothing behind.
        database = database_file(parsed)
        self._new_file = database if database is not None and not database.exists() else None
        why = why_unwritable(self._new_file) if self._new_file is not None else None
        if why:
            raise StoreError(f"cannot make the store {self._new_file}: {why}")
        try:
            sqlite = parsed.get_backend_name() == "sqlite" and "timeout" not in parsed.query
            # SQLite waits for a lock in slices, a Ctrl-C stopping the wait (_sqlite.py).
            waits = {"timeout": _sqlite.SLICE_S, "factory": _sqlite.interruptible(BUSY_TIMEOUT_S)}
            self.engine = sa.create_engine(parsed, pool_pre_ping=True, connect_args=waits if sqlite else {})
            if self._new_file is None:
                with self.engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
        except (sa.exc.NoSuchModuleError, ModuleNotFoundError) as err:
            raise StoreError(f"storage URL {self.shown!r}: no driver for {parsed.drivername!r}") from err
        except sa.exc.SQLAlchemyError as err:
            raise StoreError(f"cannot reach the store {self.shown}: "
                             f"{first_line(err)}") from err
        self._created = False
        self._stored: frozenset[str] | None = None
        """The columns of `ct_measurements` in a store read as it is (an older schema's lack
        some); None before it is read, and once `_create` brought it to this version."""

    @_store_errors
    def _create(self) -> None:
        """Make the store's tables, or upgrade an older store's, before the first write (once,
        also when several processes do it at once)."""
        if not self._created:
            if self._new_file is not None:
                try:
                    self._new_file.parent.mkdir(parents=True, exist_ok=True)
                except OSError as err:
                    raise StoreError(f"cannot make the store {self._new_file}: {err.strerror} "
                                     f"({err.filename})") from err
            else:
                self._refuse_foreign()
            try:
                _migrate.upgrade(self.engine, self.shown, create=True)
            except (sa.exc.SQLAlchemyError, StoreError) as err:
                self._remove_empty_new_file(err)
                raise
            self._created, self._stored = True, None

    def _remove_empty_new_file(self, err: Exception) -> None:
        """Remove the SQLite file this store began, where making its tables failed (a full disk)
        and left it empty: no 0-byte "store" stays behind. One another process is making its
        tables in (locked, or with its journal beside it) is left to that process."""
        new = self._new_file
        cause = err if isinstance(err, sa.exc.SQLAlchemyError) else err.__cause__
        if new is None or (isinstance(cause, sa.exc.SQLAlchemyError) and _locked(cause)):
            return
        if any(new.with_name(new.name + suffix).exists() for suffix in ("-journal", "-wal")):
            return
        self.engine.dispose()  # the pool's connections hold the file open
        with contextlib.suppress(OSError):
            if new.stat().st_size == 0:
                new.unlink()

    def _refuse_foreign(self) -> None:
        """Refuse to write to a SQLite file of another application: one with tables, none of
        them a store's (`ct_`), is left as it is.

        Raises:
            StoreError: the file holds tables and none of the store's.
        """
        path = database_file(self.engine.url)
        if path is None:
            return
        with self.engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
        if tables and not any(t.startswith("ct_") for t in tables):
            raise StoreError(f"{path} is not a cutlass-tune store: it holds {len(tables)} tables of another "
                             "application and none of a store's; give --storage a new file")

    @_store_errors
    def _readable(self) -> bool:
        """Whether the store has its measurement tables, of a schema this version reads. Reads
        never create nor upgrade them, so reading a store (a report, a best table) leaves its
        file as it was.

        Raises:
            StoreError: the store is of a newer schema, or older than `OLDEST_READ`.
        """
        if self._created or self._stored is not None:
            return True
        if self._new_file is not None and not self._new_file.exists():
            return False
        with self.engine.connect() as conn:
            schema = _migrate.stored_schema(conn, self.shown)
            if schema is None or not sa.inspect(conn).has_table(meta_table.name):
                return False
            if schema < OLDEST_READ:
                raise StoreError(f"the store {self.shown} has schema {schema}, this version reads {OLDEST_READ} to "
                                 f"{SCHEMA_VERSION}: run `cutlass-tune upgrade --storage {self.shown}` first")
            self._stored = frozenset(c["name"] for c in sa.inspect(conn).get_columns(measurements_table.name))
        return True

    def _column(self, name: str) -> sa.ColumnElement:
        """Column `name` of the measurements as a query reads it: in a store of an older schema
        that lacks it, its default ('none' in every row before the column was added)."""
        column = measurements_table.c[name]
        if self._stored is None or name in self._stored or column.server_default is None:
            return column
        default = column.server_default.arg  # type: ignore[attr-defined]
        return sa.literal(default, column.type).label(name)

    @_store_errors
    def schema(self) -> int | None:
        """The schema version of the store (this version writes `SCHEMA_VERSION`), or None for
        a new store. Writes nothing.

        Raises:
            StoreError: the store is of a newer schema than this version knows.
        """
        if self._new_file is not None and not self._new_file.exists():
            return None
        with self.engine.connect() as conn:
            return _migrate.stored_schema(conn, self.shown)

    @_store_errors
    def upgrade(self) -> int:
        """Bring an existing store to this version's schema (`SCHEMA_VERSION`), as every
        writing method does before its first write; once, also where several processes upgrade
        the store at once.

        Returns:
            The schema the store had before (`SCHEMA_VERSION` where it had it already).

        Raises:
            StoreError: there is no store there yet, it is of a newer schema, or a migration
                failed (the store is then as it was).
        """
        missing = self._new_file is not None and not self._new_file.exists()
        before = None if missing else _migrate.upgrade(self.engine, self.shown, create=False)
        if before is None:
            raise StoreError(f"no store at {self.shown} to upgrade: a sweep makes one")
        self._created, self._stored = True, None
        return before

    def _claim(self, key: str, value: str) -> str:
        """Record `value` under `key` in ct_meta unless another writer recorded one first;
        return the value that holds."""
        query = _meta_value(key)
        try:
            with self.engine.begin() as conn:
                found = conn.execute(query).scalar()
                if found is not None:
                    return found
                conn.execute(meta_table.insert(), [{"key": key, "value": value}])
                return value
        except sa.exc.IntegrityError:  # another process inserted the key after our look
            with self.engine.connect() as conn:
                return conn.execute(query).scalar_one()

    @_store_errors
    def gpu(self) -> str | None:
        """The GPU model the store belongs to, or None for a new store."""
        if not self._readable():
            return None
        with self.engine.connect() as conn:
            return conn.execute(_meta_value("gpu")).scalar()

    @_store_errors
    def bind_gpu(self, gpu_name: str) -> None:
        """Claim a new store for `gpu_name`, or check that an existing one belongs to it.

        Raises:
            StoreGpuMismatchError: the store was made on another GPU model.
        """
        self._create()
        held = self._claim("gpu", gpu_name)
        if held != gpu_name:
            raise StoreGpuMismatchError(
                f"the store {self.shown} holds results from {held}, not {gpu_name}: "
                "give this GPU its own --storage")
        schema = self._claim("schema", str(SCHEMA_VERSION))  # the upgrade recorded it; versions before it read it
        if schema != str(SCHEMA_VERSION):
            raise StoreError(f"the store {self.shown} has schema {schema}, this version writes {SCHEMA_VERSION}")

    @_store_errors
    def check_schema(self) -> None:
        """Refuse a store this version cannot read: of a newer schema, or older than
        `OLDEST_READ`. A new store passes. Writes nothing.

        Raises:
            StoreError: the store is of a schema this version does not read, in one line that
                names both versions.
        """
        self._readable()

    @_store_errors
    def timing(self) -> TimingScheme | None:
        """The timing scheme the store holds (see `bind_timing`), or None for a new store.

        Stores begun before the scheme was recorded hold only unpaired `events` figures.

        Raises:
            StoreError: the store cannot be read, or records a scheme no version wrote.
        """
        if not self._readable():
            return None
        with self.engine.connect() as conn:
            found = conn.execute(_meta_value("timing")).scalar()
            if found is None and conn.execute(sa.select(measurements_table.c.id).limit(1)).first():
                return LEGACY_TIMING
        return None if found is None else _scheme(found)

    @_store_errors
    def bind_timing(self, scheme: TimingScheme) -> None:
        """Claim the store for one timing scheme, or check that it uses it: figures taken by
        different schemes do not compare. The store records the scheme's `name`.

        Raises:
            StoreError: the store holds results timed another way.
        """
        self._create()
        found = self.timing()
        if found in (None, scheme):  # another sweep may claim the store between the look and the claim
            found = _scheme(self._claim("timing", scheme.name))
        if found != scheme:
            raise StoreError(f"the store {self.shown} holds results timed with {found}, not {scheme}: "
                             "give this sweep its own --storage")

    # ---- sweeps running at once -----------------------------------------------------------
    @contextlib.contextmanager
    def running(self, run_id: str) -> Iterator[None]:
        """Announce the sweep `run_id` as running for the block: it speaks every `HEARTBEAT_S`
        (from a thread of its own, so a long compile does not silence it) and its claims are
        given up when the block ends, however it ends."""
        self._create()
        row = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat_at": time.time()}
        try:
            dead = self._runs(alive=False)  # killed sweeps: forget them and what they held
            with self.engine.begin() as conn:
                conn.execute(claims_table.delete().where(claims_table.c.run_id.in_(dead)))
                conn.execute(runs_table.delete().where(runs_table.c.run_id.in_(dead)))
                conn.execute(runs_table.insert(), row)
        except sa.exc.SQLAlchemyError as err:
            raise read_error(self.shown, err) from err
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                with contextlib.suppress(sa.exc.SQLAlchemyError):  # a missed beat is the next one's
                    with self.engine.begin() as conn:
                        conn.execute(runs_table.update().where(runs_table.c.run_id == run_id)
                                     .values(heartbeat_at=time.time()))

        thread = threading.Thread(target=beat, name=f"heartbeat-{run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            # A store lost meanwhile keeps them: the run is dead to others once it stops speaking.
            with contextlib.suppress(sa.exc.SQLAlchemyError), self.engine.begin() as conn:
                conn.execute(claims_table.delete().where(claims_table.c.run_id == run_id))
                conn.execute(runs_table.delete().where(runs_table.c.run_id == run_id))

    @_store_errors
    def claim(self, config_hash: str, run_id: str) -> str | None:
        """Claim the config for measuring by the sweep `run_id`, which must be `running`: None
        when it is that sweep's now, else the run id of the live sweep that holds it. A claim
        of a dead sweep is taken over."""
        c, r = claims_table.c, runs_table.c
        for _ in range(_CREATE_ATTEMPTS):
            with self.engine.connect() as conn:
                held = conn.execute(sa.select(c.run_id).where(c.config_hash == config_hash)).scalar()
                owner = None if held in (None, run_id) else conn.execute(
                    sa.select(r.host, r.pid, r.heartbeat_at).where(r.run_id == held)).first()
            if held == run_id:
                return None
            if held is not None and _alive(owner, time.time()):
                return held
            try:
                with self.engine.begin() as conn:
                    if held is None:
                        conn.execute(claims_table.insert(), {"config_hash": config_hash, "run_id": run_id})
                        return None
                    # A dead sweep's claim: take it over unless another sweep just did.
                    if conn.execute(claims_table.update().where(c.config_hash == config_hash, c.run_id == held)
                                    .values(run_id=run_id)).rowcount:
                        return None
            except sa.exc.IntegrityError:
                pass  # another sweep claimed it after our look: look again
        raise StoreError(f"cannot claim config {config_hash} in {self.shown}: other sweeps keep taking it")

    def _runs(self, alive: bool | None = None) -> set[str]:
        r = runs_table.c
        now = time.time()
        with self.engine.connect() as conn:
            return {row.run_id for row in conn.execute(sa.select(r.run_id, r.host, r.pid, r.heartbeat_at))
                    if alive is None or _alive(row, now) == alive}

    @_store_errors
    def live_runs(self) -> set[str]:
        """The run ids of the sweeps running on the store now (see `running`)."""
        self._create()
        return self._runs(alive=True)

    @_store_errors
    def held_by_others(self, run_id: str) -> set[str]:
        """The configs that live sweeps other than `run_id` hold (compiling or measuring them)."""
        others = self.live_runs() - {run_id}
        c = claims_table.c
        with self.engine.connect() as conn:
            return set(conn.execute(sa.select(c.config_hash).where(c.run_id.in_(others))).scalars())

    @_store_errors
    def release(self, config_hash: str, run_id: str) -> None:
        """Give up the sweep `run_id`'s claim of the config (done with it)."""
        c = claims_table.c
        with self.engine.begin() as conn:
            conn.execute(claims_table.delete().where(c.config_hash == config_hash, c.run_id == run_id))

    @_store_errors
    def add(self, m: Measurement, *, gpu: str, run_id: str, cublas_tflops: float | None = None,
            study: str | None = None, trial: int | None = None) -> None:
        """Record one measurement in its own transaction. `cublas_tflops` is the problem's
        baseline of the same run (torch eager for a fused epilogue or scaled fp8, see
        `measurement.Baseline`); a measurement with a paired baseline uses its own instead. An
        eager baseline row's torch.compile figures live in its `record` (`compile_*`)."""
        self._create()
        self._insert([self._row(m, gpu=gpu, run_id=run_id, cublas_tflops=cublas_tflops, study=study, trial=trial)])

    @_store_errors
    def add_all(self, measurements: Sequence[Measurement], *, gpu: str, run_id: str, study: str | None = None) -> None:
        """Record `measurements` in one transaction: all of them, or (where the database fails
        meanwhile) none. Each ratio is to its own paired baseline (`Measurement.baseline_*`), as
        in `add`.

        Raises:
            StoreError: the store cannot be written; it then holds none of them.
        """
        self._create()
        rows = [self._row(m, gpu=gpu, run_id=run_id, study=study) for m in measurements]
        if rows:
            self._insert(rows)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        """`rows` into `ct_measurements` in one transaction, waiting out other writers' locks."""

        def insert() -> None:
            with self.engine.begin() as conn:
                conn.execute(measurements_table.insert(), rows)

        _despite_locks(insert)

    @staticmethod
    def _row(m: Measurement, *, gpu: str, run_id: str, cublas_tflops: float | None = None, study: str | None = None,
             trial: int | None = None) -> dict[str, Any]:
        """The `ct_measurements` row of `m` (see `add`)."""
        p = m.problem
        cublas_tflops = m.baseline_tflops or cublas_tflops
        ratio = (m.tflops / cublas_tflops) if (m.tflops and cublas_tflops) else None
        return {
            # A grouped problem's grouping, experts and routed rows are in its name and record: no
            # column holds them (nothing selects by them), so schema 2 stores them all.
            "gpu": gpu, "problem": p.name, "m": p.m, "n": p.n, "k": p.k,
            **{c: v for c, v in p.operation.cells().items() if c in measurements_table.c},
            "kernel": m.kernel_name,
            "config_hash": m.config.hash if m.config is not None else None,
            "runtime": m.runtime.name, "status": m.status.value, "reason": m.reason,
            "median_ms": m.median_ms, "p20_ms": m.p20_ms, "p80_ms": m.p80_ms, "samples": m.samples,
            "tflops": m.tflops, "cublas_tflops": cublas_tflops, "ratio": ratio,
            "compile_seconds": m.compile_seconds, "throttled": m.throttled, "run_id": run_id,
            "regime": m.regime or SUSTAINED.name,
            "study": study, "trial": trial,
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "record": json.dumps(m.to_dict()),
        }

    @_store_errors
    def measured(self, problem: Problem) -> dict[tuple[str, str], list[StoredRow]]:
        """Rows of `problem` by (config_hash, runtime name), for resuming without re-measuring;
        each with its config_hash, runtime, status, reason, tflops, ratio and kernel."""
        if not self._readable():
            return {}
        t = measurements_table
        query = sa.select(t.c.id, t.c.config_hash, t.c.runtime, t.c.status, t.c.reason, t.c.tflops,
                          t.c.ratio, t.c.kernel).where(t.c.problem == problem.name, t.c.config_hash.isnot(None))
        out: dict[tuple[str, str], list[StoredRow]] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(query):
                out.setdefault((row.config_hash, row.runtime), []).append(StoredRow.from_columns(row._asdict()))
        return out

    @_store_errors
    def rows(self, columns: Iterable[str] | None = None, *, after_id: int = 0) -> list[StoredRow]:
        """Every measurement row, in the order they were added; with `after_id`, only those
        added after the row of that `id`. Each has its `id` and the `columns` named (all but
        `record` unless named); the others are None."""
        if not self._readable():
            return []
        t = measurements_table
        names = ["id", *(c for c in columns if c != "id")] if columns else [c.name for c in t.c if c.name != "record"]
        query = sa.select(*(self._column(c) for c in names)).order_by(t.c.id)
        if after_id:
            query = query.where(t.c.id > after_id)
        with self.engine.connect() as conn:
            return [StoredRow.from_columns(r._asdict()) for r in conn.execute(query)]

    @_store_errors
    def measurements(self) -> list[Measurement]:
        """Every stored measurement, rebuilt losslessly."""
        return [r.measurement() for r in self.rows(["record"])]
