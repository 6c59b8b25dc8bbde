"""Arguments and options several commands share, and the checks of the paths they name."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import settings
from .._files import why_unwritable
from ..errors import CutlassTuneError
from ..report import same_file

CONFIG = typer.Argument(..., help="search-space YAML file (see configs/README.md)")
JOBS = typer.Option(None, "--jobs", "-j", min=1, help="parallel nvcc jobs")
CACHE_DIR = typer.Option(None, "--cache-dir", help="kernel cache (CUTLASS_TUNE_CACHE_DIR)")
GPU = typer.Option(0, "--gpu", min=0, help="CUDA device index")
READ_DEFAULT = f"default: $CUTLASS_TUNE_STORE, else {settings.DEFAULT_STORE}"
"""The end of the help of a reading command's --storage."""


def user_output(value: Path | None) -> Path | None:
    """An --output path with a leading ~ expanded as a shell would, also where no shell did
    (`--output=~/x`, a quoted '~/x'): a literal folder named ~ is never what was meant."""
    return None if value is None else settings.user_path(value, "--output")


def check_output(path: Path, source: str | None = None) -> Path:
    """`path` if a file (or a new folder) can be written there, without overwriting `source`.

    Raises:
        CutlassTuneError: an empty name, an existing folder, a parent that is a file or cannot be
            written, or the file `source` names.
    """
    if not path.name:
        raise CutlassTuneError(f"-o {str(path)!r}: give a file name")
    if path.is_dir():
        raise CutlassTuneError(f"-o {path}: is a folder")
    why = why_unwritable(path)
    if why:
        raise CutlassTuneError(f"-o {path}: {why}")
    if source is not None and same_file(source, path):
        raise CutlassTuneError(f"-o {path} is the file the results are read from: write elsewhere")
    return path
