"""Files: the folders shipped with the package, where a file can be made, and publishing one
whole. Shared by the commands' outputs, the best tables, the dashboard, the kernel cache, a new
SQLite store and the templates' loaders."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import IO, Any

from .errors import CutlassTuneError, first_line


class FileWriteError(CutlassTuneError):
    """A file cannot be written: "cannot write PATH: <reason>", one line."""


MAX_INPUT_BYTES = 64 << 20
"""The most a file a user gives is read (a space file, a best table, a bundle manifest): the
largest committed is under 1 MiB; a larger one is a mistake or an attack, refused unread."""


class InputTooLargeError(CutlassTuneError, OSError):
    """A file given as input holds more than `MAX_INPUT_BYTES`."""


class NotRegularFileError(CutlassTuneError, OSError):
    """A file given as input is a FIFO, a socket or a device: refused before it is opened."""


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file `path` (a kernel library, as the cache and a bundle record it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_NOT_REGULAR = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
                stat.S_IFBLK: "a block device"}


def read_input(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file a user gave, read at most `limit` + 1 of them.
    A FIFO, socket or device is refused before it is opened: opening a FIFO waits for a writer
    (forever, where none comes) and a device such as /dev/zero has no end.

    Raises:
        InputTooLargeError: the file holds more than `limit` bytes.
        NotRegularFileError: it is a FIFO, a socket or a device (its `strerror` says which).
        OSError: it cannot be read.
    """
    kind = _NOT_REGULAR.get(stat.S_IFMT(os.stat(path).st_mode))
    if kind is not None:
        raise NotRegularFileError(errno.EINVAL, f"not a regular file ({kind})")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputTooLargeError(f"{path} holds more than {limit >> 20} MiB, the most such an input file may hold")
    return data


def shipped(folder: str) -> Path:
    """The folder shipped with the package (`templates`, `configs`): at the repository root in
    a checkout (an editable install), inside the package in an installed wheel."""
    checkout = Path(__file__).resolve().parent.parent / folder
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("cutlass_tune") / folder))


_DESCRIPTOR = re.compile(r"/proc/(?:self|thread-self|\d+)/fd/\d+")


def _names_a_descriptor(path: Path) -> bool:
    """Whether `path` is, or links through, an open file descriptor (`/dev/stdout`, `/dev/fd/3`,
    `/proc/self/fd/1`): the kernel's own link to what the shell redirected (a pipe, a terminal,
    a file opened for appending), which resolving would lose (`pipe:[77405]` names no file)."""
    current = Path(path).absolute()
    for _ in range(40):  # the kernel's limit on links followed
        where = Path(os.path.realpath(current.parent)) / current.name
        if _DESCRIPTOR.fullmatch(str(where)):
            return True
        if not where.is_symlink():
            return False
        current = where.parent / os.readlink(where)
    return False


def _target(path: Path) -> Path:
    """Where a write to `path` lands: a symbolic link's target (the link stays), else `path`."""
    return Path(os.path.realpath(path)) if path.is_symlink() and not _names_a_descriptor(path) else path


def _is_special(path: Path) -> bool:
    """Whether `path` is a device, FIFO or socket: written through, never replaced by a file."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def why_unwritable(path: Path) -> str | None:
    """Why the file `path` could not be made, or None: its nearest existing ancestor is a file,
    or a folder this process may not write in. A symbolic link is judged by its target; a
    device or FIFO by whether it may be written."""
    path = _target(Path(path))
    if _is_special(path) or _names_a_descriptor(path):
        return None if os.access(path, os.W_OK) else f"no permission to write {path}"
    ancestor = path.parent.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"no permission to write in {ancestor}"
    return None


def write_atomically(path: Path, content: str | Callable[[IO[Any]], None], *, binary: bool = False) -> None:
    """Publish the file `path` whole: write `content` to a temporary file beside it, flush that
    to disk and rename it over `path`. Readers (another process too) see the old file or the new
    one, never a part; on any failure `path` is as it was and the temporary file is gone.
    A symbolic link stays and its target is published; a device or FIFO is written through,
    never replaced by a file, and so is an open file descriptor (`-o /dev/stdout`, whatever the
    shell redirected it to: a file given with `>>` is appended to, not replaced).

    Args:
        path: the file to write; its folder must exist.
        content: the text, or a function that writes the content to the open file it is given
            (text files are UTF-8, newlines written as given).
        binary: open the temporary file in binary mode (for a `content` function).

    Raises:
        FileWriteError: `path` cannot be written (a folder, no such folder, no permission, a
            full disk); one line naming `path`, not the temporary file.
        Exception: whatever a `content` function raises other than OSError, unchanged.
    """
    path = _target(Path(path))
    through = _names_a_descriptor(path)
    if through or _is_special(path):  # written through: a pipe or terminal cannot be synced or renamed over
        try:
            _write(path, content, binary=binary, sync=False, append=through)
        except OSError as err:
            raise FileWriteError(f"cannot write {path}: {err.strerror or first_line(err)}") from err
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        try:
            _write(tmp, content, binary=binary, sync=True, append=False)
            os.replace(tmp, path)
        except OSError as err:
            raise FileWriteError(f"cannot write {path}: {err.strerror or first_line(err)}") from err
    except BaseException:
        try:
            tmp.unlink()
        except OSError:  # never created (no such folder, no permission), or already renamed
            pass
        raise


def _write(path: Path, content: str | Callable[[IO[Any]], None], *, binary: bool, sync: bool,
           append: bool) -> None:
    # Text as pandas opens a path: UTF-8, newlines as written. Appending to a descriptor keeps
    # what the shell's `>>` file held (opening it for writing would truncate it).
    mode = ("a" if append else "w") + ("b" if binary else "")
    with open(path, mode, encoding=None if binary else "utf-8", newline=None if binary else "") as f:
        if isinstance(content, str):
            f.write(content)
        else:
            content(f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
