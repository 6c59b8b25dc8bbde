"""Content-addressed cache of compiled kernels.

Layout under the root (process-safe; several compilers may share it):

    units/<unit_key>/           one translation unit: unit.cu, build.log, kernels.so
    kernels/<kk>/<key>.json     one entry per kernel: status, unit, symbol, seconds, reason
    locks/<key>.lock            held while a kernel is being built
    tmp/                        builds in progress, renamed into units/ when complete

A unit directory appears by one atomic rename, after its .so is fully written; an entry file
is written to a temporary name and renamed after its unit exists. A reader therefore sees a
complete kernel or none. Compile failures are cached with their log so they are not retried.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import filelock

from .. import settings
from .._files import write_atomically
from ..space import KernelConfig
from ..status import Status

CACHE_LAYOUT_VERSION = "v1"


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
            unit = self.unit_dir(entry["unit"])
            status = Status(entry["status"])
            symbol, seconds, reason = str(entry["symbol"]), float(entry["seconds"]), str(entry.get("reason", ""))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # gone, or not an entry
            return None
        library = unit / "kernels.so"
        if status is Status.OK and not library.exists():
            return None
        return CompiledKernel(
            config=config, key=key, status=status,
            library=library if status is Status.OK else None, symbol=symbol,
            seconds=seconds, cached=True, reason=reason,
            log_path=unit / "build.log", source_path=unit / "unit.cu",
        )

    def new_build_dir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="build-", dir=self.root / "tmp"))

    def publish(self, build_dir: Path, unit_key: str, results: list[CompiledKernel]) -> list[CompiledKernel]:
        """Move a finished build into place and record its kernels. Returns the results with
        paths pointing into the cache. If another process published the same unit first, its
        copy is kept and ours deleted, unless its library is gone."""
        target = self.unit_dir(unit_key)
        try:
            # A folder, so a rename and not `write_atomically`: it fails where another process
            # published the unit first, which is how this one learns to keep theirs.
            os.rename(build_dir, target)
        except OSError:
            if not target.exists():
                raise
            if (build_dir / "kernels.so").exists() and not (target / "kernels.so").exists():
                # The unit in place lost its library: ours replaces it.
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
