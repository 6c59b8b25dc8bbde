"""SQLite connections whose waits for another process's lock a Ctrl-C can stop.

SQLite's busy timeout waits inside one C call, where Python runs no signal handler: a Ctrl-C on
a store that another process held locked took effect only when the wait ended (60 s), and an
API writer then saw "database is locked". These connections give SQLite a short busy timeout
(`SLICE_S`) and wait the rest out in Python, one slice after another, so a KeyboardInterrupt
is raised within a slice of the key press. A statement (or commit) that found the database
locked had no effect, so trying it again is what SQLite's own busy handler does.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

SLICE_S = 0.1
"""How long SQLite itself waits for a lock before Python gets a turn (and a Ctrl-C its effect)."""
T = TypeVar("T")


def locked(err: BaseException) -> bool:
    """Whether `err` is SQLite's "database is locked" (or "is busy")."""
    return any(s in str(err) for s in ("database is locked", "database is busy"))


def _waiting(call: Callable[[], T], wait_s: float) -> T:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call()
        except sqlite3.OperationalError as err:
            if not locked(err) or time.monotonic() >= deadline:
                raise


class InterruptibleCursor(sqlite3.Cursor):
    """A cursor whose statements wait for a lock up to its connection's `wait_s`, in slices."""

    connection: InterruptibleConnection

    def execute(self, sql: str, parameters: Any = (), /) -> InterruptibleCursor:
        return _waiting(lambda: sqlite3.Cursor.execute(self, sql, parameters), self.connection.wait_s)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> InterruptibleCursor:
        rows = list(seq_of_parameters)  # an iterator is used up by a try that found the lock
        return _waiting(lambda: sqlite3.Cursor.executemany(self, sql, rows), self.connection.wait_s)


class InterruptibleConnection(sqlite3.Connection):
    """A connection (`sqlite3.connect(..., timeout=SLICE_S, factory=...)`) whose statements and
    commits wait for another process's lock up to `wait_s` seconds, a Ctrl-C stopping them."""

    wait_s: float = 60.0

    def cursor(self, factory: Any = InterruptibleCursor) -> Any:
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> sqlite3.Cursor:
        return self.cursor().executemany(sql, seq_of_parameters)

    def commit(self) -> None:
        _waiting(lambda: sqlite3.Connection.commit(self), self.wait_s)


def interruptible(wait_s: float) -> type[InterruptibleConnection]:
    """The connection class whose lock waits last up to `wait_s` seconds in all."""
    return type("InterruptibleConnection", (InterruptibleConnection,), {"wait_s": wait_s})
