"""The consoles the commands print to, and the ways several commands print."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# A pipe or a log file gets wide tables instead of columns cut to 80 characters.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 220)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` as one line on stderr and exit with `code`."""
    line = " ".join(message.split())
    err.print(f"error: {line[:1000]}" + (" ..." if len(line) > 1000 else ""), markup=False)
    sys.exit(code)


def figure(value: float | None, spec: str) -> str:
    """`value` formatted by `spec`, or "-" where it is missing (None or NaN)."""
    return "-" if value is None or value != value else format(value, spec)


@contextlib.contextmanager
def progress(label: str, total: int) -> Iterator[Callable[..., None]]:
    """A progress bar on a terminal's stderr (gone when done); nothing on a pipe or log.
    Yields the function to call once per finished item."""
    if not err.is_terminal:
        yield lambda *_: None
        return
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda *_: bar.advance(task)
