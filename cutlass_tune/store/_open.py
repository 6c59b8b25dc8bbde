"""What `--storage` names, resolved and checked in one place for every command.

A source is a SQLAlchemy URL, a SQLite file (`.sqlite`, `.sqlite3`, `.db`) or, for the
commands that read best-config tables, a table file or bundle directory; none given means the
default store of `settings` (a sweep instead writes to its GPU's store under results/).
Opening a store to read never writes to it: a SQLite file that does not exist is refused, not
made. A store a sweep writes to may be new: its file is made by
its first write (see `ResultStore`).
"""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy as sa

from .. import settings
from ._sql import ResultStore, StoreError, database_file, shown_url, sqlite_url

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
RESULTS_DIR = Path("results")
"""Where sweeps keep their stores by default (relative to the working directory)."""


def _expanded(source: str | Path, given_as: str) -> str:
    """`source` with a leading `~` or `~user` expanded as a shell would: a shell leaves the
    path of `--storage=~/x.sqlite` (and a quoted one, and CUTLASS_TUNE_STORE's) as it is. A URL
    is left as it is.

    Raises:
        CutlassTuneError: `~user` names no user of this host.
    """
    text = str(source)
    return str(settings.user_path(text, given_as)) if text.startswith("~") else text


def store_url_of(source: str | Path) -> str | None:
    """`source` as a store URL: a URL as it is, a SQLite file as a `sqlite:///` URL (a leading
    `~` expanded); None for anything else (a table file or bundle)."""
    text = str(source)
    if "://" in text:
        return text
    if Path(text).suffix in SQLITE_SUFFIXES:
        return sqlite_url(_expanded(text, 'the store'))
    return None


def local_file(source: str | Path) -> Path | None:
    """The file (or folder) `source` names on this host: a path as it is, a SQLite store's
    database; None for a store on a server, an in-memory one or a URL that does not parse."""
    url = store_url_of(source)
    if url is None:
        return Path(source)
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):  # ValueError: a port that is not a number
        return None
    return database_file(parsed)


def default_store_url(gpu_name: str, results_dir: str | Path = RESULTS_DIR) -> str:
    """`sqlite:///results/sweep-<gpu>.sqlite`: one embedded store per GPU model."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"
    return sqlite_url(Path(results_dir) / f"sweep-{slug}.sqlite")


def resolve_storage(storage: str | None) -> str:
    """`--storage` as given, or, when None, the default store of the reading commands
    (`settings.default_store()`: $CUTLASS_TUNE_STORE, else `settings.DEFAULT_STORE`); a path's
    leading `~` expanded as a shell would.

    Raises:
        StoreError: none given and the default store is a file that is not there.
        CutlassTuneError: a path begins with `~user` of no user of this host.
    """
    if storage:
        return _expanded(storage, "--storage")
    default = _expanded(settings.default_store(), "CUTLASS_TUNE_STORE")
    path = local_file(default)
    if path is not None and not path.exists():
        raise StoreError(f"give --storage: the default store {shown_url(default)} is not here "
                         "(run from the repository's root, or set CUTLASS_TUNE_STORE)")
    return default


def open_store(source: str | Path, *, new: bool = False) -> ResultStore:
    """The store `source` names (a URL or a SQLite file), reached and ready to read.

    Args:
        new: the store may not exist yet (a sweep's); its SQLite file is then made by its first
            write. Otherwise a SQLite file that does not exist is refused and left unmade.

    Raises:
        StoreError: `source` names no store (a table file), no such SQLite file (unless `new`),
            or what `ResultStore` raises (a malformed URL, no driver, a server not reached).
    """
    url = store_url_of(source)
    if url is None:
        raise StoreError(f"--storage {source}: expected a store URL or a .sqlite file")
    path = local_file(url)
    if not new and path is not None and not path.exists():
        raise StoreError(f"no store at sqlite:///{path}")  # the name as given, not quoted
    return ResultStore(url)
