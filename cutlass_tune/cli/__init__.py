"""`cutlass-tune` command line: thin commands over the pipeline stages, one module each.

Bad input prints one line on stderr and exits 2; failures of the work itself (a kernel that
does not compile) are reported in the output and exit 1. The commands that need no GPU
(`space`, `compile`, `best`, `export`, `dashboard`) never import torch: the GPU and search
stages (torch, optuna), the model capture of `shapes` (torch) and the dashboard (plotly) are
imported inside the commands that use them.
"""

from __future__ import annotations

import logging
import signal
import sys

import typer

from .. import __version__, settings
from ..errors import CutlassTuneError, visible
from . import (
    _bench,
    _best,
    _check,
    _compile,
    _confirm,
    _dashboard,
    _export,
    _native,
    _shapes,
    _space,
    _sweep,
    _tune_model,
    _upgrade,
)
from ._console import err, fail, out


def _environment() -> str:
    """The help's list of the environment variables `settings` reads (its docstring's table)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in (settings.__doc__ or "").splitlines() if line.startswith("| CUTLASS_TUNE_")]
    return "Environment variables:\n\n" + "\n\n".join(f"{name}: {what} (default: {default})"
                                                        for name, what, default in rows).replace(
        "`DEFAULT_STORE`", settings.DEFAULT_STORE)


app = typer.Typer(add_completion=False, no_args_is_help=True, epilog=_environment(),
                  help="Autotune CUTLASS 3.x GEMM kernels on Hopper (SM90).")
# In the order `--help` lists them.
app.command()(_space.space)
app.command()(_shapes.shapes)
app.command("compile")(_compile.compile_)
app.command()(_bench.bench)
app.command()(_best.best)
app.command()(_check.check)
app.command("tune-model")(_tune_model.tune_model)
app.command()(_export.export)
app.command()(_confirm.confirm)
app.command()(_dashboard.dashboard)
app.command()(_upgrade.upgrade)
app.command()(_native.native)
app.command()(_sweep.sweep)


def _show_version(value: bool) -> None:
    if value:
        out.print(f"cutlass-tune {__version__}")
        raise typer.Exit()


class _VisibleFormatter(logging.Formatter):
    """Log lines as `visible` text: a warning or a log line may carry a store's row or a file
    name, whose control characters must not reach the terminal (as the consoles' text cannot)."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                          help="print the version and exit"),
             verbose: bool = typer.Option(False, "--verbose", "-v", help="log what the stages do (INFO), e.g. "
                                          "what the prior was fitted on"),
             quiet: bool = typer.Option(False, "--quiet", "-q", help="log errors only (no warnings)")) -> None:
    """Options of `cutlass-tune` itself, before a command (the app's help is `app`'s)."""
    if verbose and quiet:
        raise CutlassTuneError("--verbose and --quiet: give one")
    level = logging.INFO if verbose else logging.ERROR if quiet else logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr, force=True)
    logging.getLogger().handlers[0].setFormatter(_VisibleFormatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    logging.captureWarnings(True)  # warnings.warn of the stages go through the same levels


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """The console script: run the command of `sys.argv`; exit 2 with one line for bad input,
    130 when interrupted."""
    # A parent that started us in the background may have set SIGINT to "ignore"; Ctrl-C,
    # SIGTERM and SIGHUP must still stop nvcc and clean up.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)  # a closed terminal or a dropped ssh session
    try:
        settings.check()
        # Without standalone mode, click returns the code of a typer.Exit or an interrupt.
        code = app(standalone_mode=False)
    except CutlassTuneError as e:
        fail(str(e))
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:  # the parser turns KeyboardInterrupt into Abort
        err.print("interrupted")
        sys.exit(130)
    except OSError as e:  # a path given that cannot be read or written (a folder, a full disk)
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        fail(f"{where}: {e.strerror}" if where and e.strerror else str(e))
    except Exception as e:
        _usage_error(e)
        raise
    if code == 130:
        err.print("interrupted")
    sys.exit(code if isinstance(code, int) else 0)


def _usage_error(e: Exception) -> None:
    """Show a usage error (click's ClickException, or typer's vendored copy in typer >= 0.29)
    and exit with its code; return for any other exception."""
    usage_code = getattr(e, "exit_code", None)
    if hasattr(e, "show") and isinstance(usage_code, int):
        if type(e).__name__ == "NoArgsIsHelpError" or not hasattr(e, "format_message"):
            e.show()
            sys.exit(usage_code)
        ctx = getattr(e, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        fail(f"{where}{e.format_message()} (see --help)", usage_code)
