"""The consoles the commands print to, and the ways several commands print.

Every string these consoles print (a message, a table's cell or title, a live display) is
literal text: never parsed as rich markup, its control characters shown as escapes. Most of
what the commands print comes from files they did not write (a store, a table, a bundle's
manifest, a space file, a compiler's message), and `[/x]` in it crashed rich's markup parser,
`[with T=int]` vanished, `[link=...]` made a link and ESC sequences reached the terminal.
Styling of our own goes in `rich.text.Text` spans, never in markup.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, NoReturn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..errors import visible
from ..status import Status


class PlainConsole(Console):
    """A console that renders every string as literal `visible` text, whatever `markup=` a caller passes:
    untrusted text cannot reach rich's markup parser or the terminal's control sequences by any
    path (print, a table's cells and title, a live display)."""

    def __init__(self, **kwargs: Any):
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)

    def render_str(self, text: str, *, style: Any = "", justify: Any = None, overflow: Any = None,
                   emoji: bool | None = None, markup: bool | None = None, highlight: bool | None = None,
                   highlighter: Any = None) -> Text:
        return Text(visible(text), style=style, justify=justify, overflow=overflow)


def file_console(file: IO[str], width: int) -> Console:
    """A `PlainConsole` writing to `file` (a table saved as text)."""
    return PlainConsole(file=file, width=width)


# A pipe or a log file gets wide tables instead of columns cut to 80 characters.
out = PlainConsole(soft_wrap=True, width=None if sys.stdout.isatty() else 220)
err = PlainConsole(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` as one line on stderr and exit with `code`."""
    line = " ".join(message.split())
    err.print(f"error: {line[:1000]}" + (" ..." if len(line) > 1000 else ""))
    sys.exit(code)


def figure(value: float | None, spec: str) -> str:
    """`value` formatted by `spec`, or "-" where it is missing (None or NaN)."""
    return "-" if value is None or value != value else format(value, spec)


TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
"""How lines to a log are stamped (the logging module's lines, cli/__init__.py, too)."""


def stamped(text: str) -> str:
    """`text` after the local time: a line for a log, read later, when it happened."""
    return f"{time.strftime(TIME_FORMAT)} {text}"


def names(configs: Any, most: int = 3) -> str:
    """The names of the first `most` configs ("a, b, c and 9 more"): what a compile begins."""
    shown = [c.name for c in list(configs)[:most]]
    rest = len(configs) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")


def outcome(kernel: Any) -> str:
    """A compiled kernel (`compile.CompiledKernel`) in a few words, for a progress line: its
    name and whether it was cached, built (in how long) or failed."""
    if kernel.status is not Status.OK:
        return f"{kernel.config.name} {kernel.status.value}"
    return f"{kernel.config.name} cached" if kernel.cached else f"{kernel.config.name} built in {kernel.seconds:.0f} s"


@contextlib.contextmanager
def progress(label: str, total: int, describe: Callable[[Any], str] | None = None,
             starting: str | None = None) -> Iterator[Callable[..., None]]:
    """Progress on stderr: a bar on a terminal (gone when done); on a pipe or a log, a
    `stamped` line at the start where `starting` says what begins ("compiling 0/12: <starting>")
    and one per finished item ("compiling 3/12: <describe(item)>"), so that a long command is
    never silent there. Yields the function to call once per finished item (with the item,
    from any thread)."""
    if not err.is_terminal:
        if starting is not None:
            err.print(stamped(f"{label} 0/{total}: {starting}"))
        done = 0
        lock = threading.Lock()

        def line(item: Any = None) -> None:
            nonlocal done
            with lock:
                done += 1
                said = f": {describe(item)}" if describe is not None and item is not None else ""
                err.print(stamped(f"{label} {done}/{total}{said}"))

        yield line
        return
    if starting is not None:
        label = f"{label} ({starting[:60]}{'...' if len(starting) > 60 else ''})"
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda *_: bar.advance(task)
