"""Content-addressed cache of compiled kernels.

Layout under the root (process-safe; several compilers may share it):

    units/<unit_key>/           one translation unit: unit.cu, build.log, kernels.so, library.json
    kernels/<kk>/<key>.json     one entry per kernel: status, unit, symbol, seconds, reason
    locks/<key>.lock            held while a kernel is being built
    tmp/                        builds in progress, renamed into units/ when complete

A unit directory appears by one atomic rename, after its .so is fully written; an entry file
is written to a temporary name and renamed after its unit exists. A reader therefore sees a
complete kernel or none. Compile failures are cached with their log so they are not retried
(the compiler's own diagnosis only: a compiler killed by a signal, a full disk or a timeout
are not, see `_driver`).

A library is served only if it is what was built: `library.json` records its size and
SHA-256, checked before every lookup returns it (a truncated or overwritten file would kill
the process that loads it with SIGBUS), and a library without it is not served (any ELF file
could pass). It must also be an ELF shared object exporting the ABI version function, checked
without loading it (`kernel._elf`) before it is published and before a lookup serves it. An entry
names its unit by its key only, a folder inside `units/` (a cache may be shared: an entry must
not point at a file elsewhere). A damaged or refused unit is a miss, and the rebuild replaces it
in place.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

import filelock

from .. import settings
from .._files import sha256_of, write_atomically
from ..kernel._elf import library_problem
from ..render import kernel_symbol
from ..space import KernelConfig
from ..status import Status

CACHE_LAYOUT_VERSION = "v1"
_HOST = socket.gethostname().replace("-", "_")
_UNIT_KEY = re.compile(r"[0-9a-f]{64}")
DIGEST = "library.json"
"""The file of a unit that records its library's size and SHA-256."""


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """What compiling one config produced.

    `status` is OK (then `library` and `symbol` locate the entry points), COMPILE_ERROR or
    TIMEOUT (then `reason` is the first error line and `log_path`/`source_path` the evidence).
    """

    config: KernelConfig
    key: str
    status: Status
    library: Path | None
    symbol: str
    seconds: float
    cached: bool
    reason: str = ""
    log_path: Path | None = None
    source_path: Path | None = None
    transient: bool = False
    """The failure says nothing about the kernel (a timeout, nvcc killed by a signal, a full
    disk): not cached, and not stored as the kernel's outcome, so the next run tries again."""


class KernelCache:
    """The cache under `root` (its layout version below it), its folders made if need be.

    Raises:
        OSError: a folder cannot be made (a file in the way, no permission).
    """

    def __init__(self, root: Path):
        self.root = Path(root) / CACHE_LAYOUT_VERSION
        for sub in ("units", "kernels", "locks", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @classmethod
    def at(cls, root: Path | None = None) -> KernelCache:
        """The cache at `root` (a `--cache-dir`), or where the settings put it when None."""
        return cls(settings.user_path(root, "--cache-dir") if root is not None else settings.cache_dir())

    def _entry_path(self, key: str) -> Path:
        return self.root / "kernels" / key[:2] / f"{key}.json"

    def unit_dir(self, unit_key: str) -> Path:
        return self.root / "units" / unit_key

    def lock(self, key: str) -> filelock.FileLock:
        return filelock.FileLock(str(self.root / "locks" / f"{key}.lock"))

    def lookup(self, key: str, config: KernelConfig) -> CompiledKernel | None:
        """The cached outcome for `key`, or None when it was never built (or its files are gone)."""
        try:
            entry = json.loads(self._entry_path(key).read_text())
            status = Status(entry["status"])
            symbol, seconds, reason = str(entry["symbol"]), float(entry["seconds"]), str(entry.get("reason", ""))
            unit = self._unit_of(entry["unit"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # gone, or not an entry
            return None
        library = unit / "kernels.so"
        if symbol != kernel_symbol(config):
            return None
        if status is Status.OK and not (intact(unit) and _valid_library(library) is None):
            return None
        return CompiledKernel(
            config=config, key=key, status=status,
            library=library if status is Status.OK else None, symbol=symbol,
            seconds=seconds, cached=True, reason=reason,
            log_path=unit / "build.log", source_path=unit / "unit.cu",
        )

    def _unit_of(self, name: object) -> Path:
        """The unit folder an entry names, refused (ValueError) unless it is a unit key naming
        a folder that lies, links resolved, inside `units/`."""
        if not isinstance(name, str) or not _UNIT_KEY.fullmatch(name):
            raise ValueError(f"not a unit key: {name!r}")
        unit = self.unit_dir(name)
        units = (self.root / "units").resolve()
        for path in (unit, unit / "kernels.so"):
            if path.exists() and path.resolve().parent != (units if path is unit else unit.resolve()):
                raise ValueError(f"{path} leads outside the cache")
        return unit

    def new_build_dir(self) -> Path:
        """A folder for one build, named for this host and process (see `remove_stale_builds`)."""
        build = Path(tempfile.mkdtemp(prefix=f"build-{_HOST}-{os.getpid()}-", dir=self.root / "tmp"))
        # mkdtemp makes it 0700; as a unit it must be as readable as the rest of the cache
        # (others sharing the cache load its library), so the umask decides, as for any folder.
        build.chmod(0o777 & ~_umask())
        return build

    def remove_stale_builds(self) -> list[Path]:
        """Remove the build folders of processes of this host that are gone (a compile killed
        with SIGKILL, or by a closed terminal); returns what it removed."""
        removed = []
        for path in (self.root / "tmp").glob(f"build-{_HOST}-*-*"):
            pid = path.name[len(f"build-{_HOST}-"):].split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    def publish(self, build_dir: Path, unit_key: str, results: list[CompiledKernel]) -> list[CompiledKernel]:
        """Move a finished build into place and record its kernels. Returns the results with
        paths pointing into the cache. If another process published the same unit first, its
        copy is kept and ours deleted, unless its library is gone."""
        target = self.unit_dir(unit_key)
        if (build_dir / "kernels.so").exists():
            record_digest(build_dir)
        try:
            # A folder, so a rename and not `write_atomically`: it fails where another process
            # published the unit first, which is how this one learns to keep theirs.
            os.rename(build_dir, target)
        except OSError:
            if not target.exists():
                raise
            if (build_dir / "kernels.so").exists() and not intact(target):
                # The unit in place lost its library, or holds a damaged one: ours replaces it.
                stale = Path(tempfile.mkdtemp(prefix="stale-", dir=self.root / "tmp"))
                os.rename(target, stale / "unit")
                os.rename(build_dir, target)
                shutil.rmtree(stale, ignore_errors=True)
            else:
                shutil.rmtree(build_dir, ignore_errors=True)
        published = []
        for r in results:
            entry = {
                "status": r.status.value, "unit": unit_key, "symbol": r.symbol,
                "seconds": r.seconds, "reason": r.reason, "config": r.config.to_dict(),
            }
            path = self._entry_path(r.key)
            path.parent.mkdir(exist_ok=True)
            write_atomically(path, json.dumps(entry, indent=1))
            published.append(dataclasses.replace(
                r,
                library=target / "kernels.so" if r.status is Status.OK else None,
                log_path=target / "build.log", source_path=target / "unit.cu",
            ))
        return published


def record_digest(unit: Path) -> None:
    """Record the size and SHA-256 of `unit`'s library in its `DIGEST` file."""
    library = unit / "kernels.so"
    (unit / DIGEST).write_text(json.dumps({"bytes": library.stat().st_size, "sha256": sha256_of(library)}))


def intact(unit: Path) -> bool:
    """Whether `unit`'s library is the one that was built: its `DIGEST` file is there and
    matches (see the module's docstring)."""
    library = unit / "kernels.so"
    try:
        stat = library.stat()
        recorded = json.loads((unit / DIGEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict) or recorded.get("bytes") != stat.st_size:
        return False
    return _cached_sha256(str(library), stat.st_size, stat.st_mtime_ns, stat.st_ino) == recorded.get("sha256")


@functools.lru_cache(maxsize=4096)
def _cached_sha256(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """`sha256_of`, once per file version in a process (a sweep looks kernels up many times)."""
    return sha256_of(Path(path))


def _valid_library(library: Path) -> str | None:
    """`library_problem`, once per file version in a process."""
    try:
        stat = library.stat()
    except OSError as err:
        return str(err)
    return _cached_problem(str(library), stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=4096)
def _cached_problem(path: str, size: int, mtime_ns: int, inode: int) -> str | None:
    return library_problem(Path(path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _umask() -> int:
    """The process's umask, read without setting it (setting it, even back, races with the
    threads that create files meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
