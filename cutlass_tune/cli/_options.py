"""Arguments and options several commands share, and the checks of the paths they name."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import settings
from .._files import shipped, why_unwritable
from ..errors import CutlassTuneError
from ..report import same_file
from ._console import err

SHIPPED_CONFIGS = shipped("configs")
"""The search-space files shipped with the package (configs/ of a checkout, or the wheel's copy)."""


def space_file(value: Path | None) -> Path | None:
    """A search-space file as given, or, where no such file is here and it names one of the
    shipped files (`quick.yaml`, `configs/quick.yaml`), the shipped one: a user outside a checkout
    follows the examples too. Says so on stderr when it does."""
    if value is None or value.exists() or value.parent not in (Path("."), Path("configs")):
        return value
    candidate = SHIPPED_CONFIGS / value.name
    if not candidate.is_file():
        return value
    err.print(f"{value} is not here: reading the copy shipped with cutlass-tune, {candidate}")
    return candidate


_FILE_HELP = (f"search-space YAML file, or the name of one shipped with cutlass-tune (e.g. configs/quick.yaml; "
              f"they and their format, README.md, are in {SHIPPED_CONFIGS})")
CONFIG = typer.Argument(..., help=_FILE_HELP, callback=space_file)
# The space a sweep tunes and `space` counts (space.sweep_space): a file, shapes, or shapes over a file's knobs.
SPACE_FILE = typer.Argument(None, help=f"{_FILE_HELP}; without it, --shapes over every valid config (kernels: auto)",
                            callback=space_file)
SHAPES = typer.Option(None, "--shapes", help="MxNxK[,MxNxK...]: tune these shapes, over every valid config or, with "
                      "a file, over its knobs; MoE experts as one grouped GEMM: eE:ROWSxNxK (e128:32768x1536x2048: "
                      "128 experts, 32768 routed rows); their weight gradients: dwE:ROWSxNxK")
DTYPE = typer.Option(None, "--dtype", help="with --shapes: IN or IN:OUT types (default bf16, or the file's)")
LAYOUT = typer.Option(None, "--layout", help="with --shapes: tn, nt, nn or tt (default tn, or the file's)")
EPILOGUE = typer.Option(None, "--epilogue", help="with --shapes: what the GEMM's last pass computes, e.g. bias+silu, "
                        "gelu_tanh, residual (default none, or the file's)")
SCALING = typer.Option(None, "--scaling", help="with --shapes and fp8 --dtype: tensor, rowcol or blockwise "
                       "(1x128 A, 128x128 B) scales, as torch._scaled_mm takes them (default none, or the file's)")
ROUTING = typer.Option(None, "--routing", help="with grouped --shapes (eE: or dwE:ROWSxNxK): how the rows fall over "
                       "the experts: uniform, zipf, or both as uniform,zipf (default uniform)")
JOBS = typer.Option(None, "--jobs", "-j", min=1, envvar="CUTLASS_TUNE_JOBS",
                    help="parallel nvcc jobs (default: bounded by cores and memory)")
CACHE_DIR = typer.Option(None, "--cache-dir", envvar="CUTLASS_TUNE_CACHE_DIR",
                         help="kernel cache (default: the user cache dir)")
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
