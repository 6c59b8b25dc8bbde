"""What a running sweep shows: a live table on a terminal, plain lines in a log."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from rich.live import Live
from rich.table import Table

from ._console import PlainConsole, stamped


def sweep_table(state) -> Table:
    """Each problem's measured and failed kernels and its best so far, under the sweep's counts."""
    table = Table("problem", "kernels measured", "failed", "cuBLAS TFLOP/s", "best TFLOP/s",
                  "vs cuBLAS", "best at", "best config", box=None, pad_edge=False,
                  title=f"compiled {state.compiled}, next batch {state.queued}, invalid proposals "
                        f"{state.invalid}" + "".join(f"; given up: {r}" for r in state.lost),
                  title_justify="left")
    for pp in state.problems:
        table.add_row(pp.problem.name, str(pp.measured), str(pp.failed),
                      f"{pp.cublas_tflops:.1f}" if pp.cublas_tflops else "-",
                      f"{pp.best_tflops:.1f}" if pp.best_tflops else "-",
                      f"{pp.best_ratio:.3f}" if pp.best_ratio else "-",
                      str(pp.best_at) if pp.best_at else "-",
                      pp.best_config.name if pp.best_config else "-")
    return table


class SweepLog:
    """A sweep's progress as plain lines, for output that is not a terminal (a log file, a batch
    job), where a live table would show nothing until the end: a line when a batch is compiled
    or a kernel is measured on every problem, a line for each new best, one for a GPU given up,
    each `stamped` with its time (a log is read later: when did the best come, how fast did it go)."""

    def __init__(self, console: PlainConsole):
        self.console = console
        self.counts: tuple[int, int, int] | None = None
        self.best: dict[str, tuple] = {}
        self.lost = 0

    def __call__(self, state) -> None:
        def say(text: str) -> None:
            self.console.print(stamped(text))

        for reason in state.lost[self.lost:]:
            say(f"given up: {reason}")
        self.lost = len(state.lost)
        counts = (state.compiled, sum(pp.measured for pp in state.problems),
                  sum(pp.failed for pp in state.problems))
        if state.compiled and counts != self.counts:
            say(f"compiled {counts[0]} configs, compiling {state.queued} more; {counts[1]} kernel-problem "
                f"pairs measured, {counts[2]} failed")
        self.counts = counts
        for pp in state.problems:
            best = (pp.best_ratio, pp.best_config.hash if pp.best_config else None)
            if pp.best_ratio and best != self.best.get(pp.problem.name):
                found = f"config {pp.best_at}" if pp.best_at else "in the store: an earlier run or another sweep"
                say(f"best {pp.problem.name}: {pp.best_ratio:.3f} of cuBLAS, {pp.best_tflops:.1f} TFLOP/s, "
                    f"{pp.best_config.name if pp.best_config else '?'} ({found})")
                self.best[pp.problem.name] = best


def sweep_display(console: PlainConsole) -> tuple[contextlib.AbstractContextManager[object], Callable[..., None]]:
    """The context to run a sweep in and the function to call with each new state: a live table
    on a terminal; on a log, lines as things happen (the caller prints the table at the end).
    A `PlainConsole`: the problems, configs and reasons shown come from the store."""
    if console.is_terminal:
        live = Live(console=console, refresh_per_second=2, transient=False)
        return live, lambda state: live.update(sweep_table(state))
    return contextlib.nullcontext(), SweepLog(console)
