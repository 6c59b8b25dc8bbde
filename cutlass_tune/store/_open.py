"""What `--storage` names, resolved and checked in one place for every command.

A source is a SQLAlchemy URL, a SQLite file (`.sqlite`, `.sqlite3`, `.db`) or, for the
commands that read best-config tables, a table file or bundle directory; none given means the
default store of `settings` (a sweep instead writes to its GPU's store under results/).
Opening a store to read never writes to it: a SQLite file that does not exist is refused, not
made. A store a sweep writes to may be new: its file is made by
its first write (see `ResultStore`).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from .. import settings
from ..errors import CutlassTuneError
from ._sql import ResultStore, StoreError, database_file, shown_url, sqlite_url

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
COMPRESSED_SUFFIX = ".gz"
"""A SQLite store compressed with gzip (`x.sqlite.gz`, as stores are committed): read from a copy."""
MAX_DECOMPRESSED_BYTES = 4 << 30
"""The most a compressed store is decompressed to (the largest committed is under 40 MB): a
larger one is a mistake or a gzip bomb, refused before it fills the disk."""
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


def is_compressed_store(source: str | Path) -> bool:
    """Whether `source` names a gzip-compressed SQLite file (`x.sqlite.gz`)."""
    text = str(source)
    return "://" not in text and text.endswith(COMPRESSED_SUFFIX) and \
        Path(text[:-len(COMPRESSED_SUFFIX)]).suffix in SQLITE_SUFFIXES


@contextlib.contextmanager
def readable_store(source: str | Path) -> Iterator[str | Path]:
    """`source` as a store to read: itself, or for a gzip-compressed SQLite file
    (`is_compressed_store`) the `sqlite:///` URL of a read-only decompressed copy in a temporary
    folder, removed on leaving. Errors raised inside name `source`, not the copy.

    Raises:
        StoreError: no such compressed file, or one that is not whole gzip data (damaged,
            truncated) or decompresses to more than `MAX_DECOMPRESSED_BYTES`; one line.
    """
    if not is_compressed_store(source):
        yield source
        return
    path = Path(_expanded(source, "the store"))
    if not path.is_file():
        raise StoreError(f"no store at {path}" if not path.exists() else f"{path} is not a file")
    with tempfile.TemporaryDirectory(prefix="cutlass-tune-store-") as folder:
        copy = Path(folder) / path.name[:-len(COMPRESSED_SUFFIX)]
        try:
            with gzip.open(path, "rb") as packed, open(copy, "wb") as unpacked:
                while block := packed.read(1 << 20):
                    unpacked.write(block)
                    if unpacked.tell() > MAX_DECOMPRESSED_BYTES:
                        raise StoreError(f"{path} decompresses to more than {MAX_DECOMPRESSED_BYTES >> 30} GiB, "
                                         "the most a compressed store may hold")
        except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
            reason = str(err) or type(err).__name__
            raise StoreError(f"{path} is not a readable gzip-compressed SQLite store ({reason})") from err
        os.chmod(copy, 0o444)  # read here only: a reader that tried to write would fail, not change a copy
        try:
            yield sqlite_url(copy)
        except CutlassTuneError as err:
            # The copy is gone once this returns: a message names the file the user gave.
            err.args = tuple(str(a).replace(str(copy), str(path)) if isinstance(a, str) else a for a in err.args)
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)


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
