"""The timing of the commands that measure: their `--method` and `--paired` options, and the
scheme those resolve to."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ..measurement import TimingMethod, TimingScheme

if TYPE_CHECKING:
    from ..bench import TimingOptions

BENCH_METHOD = typer.Option(
    TimingMethod.EVENTS, "--method", help="events: single L2-cold launches; graph: CUDA-graph replays (warm L2, "
    "for small problems); sustained: back-to-back launches over rotating operands at settled clocks, as a "
    "model's stream of GEMMs runs")
BENCH_PAIRED = typer.Option(True, "--paired/--no-paired",
                            help="time cuBLAS alternately with each kernel (the ratio's baseline)")
SWEEP_METHOD = typer.Option(
    None, "--method", help="how kernels and cuBLAS are timed: events, graph or sustained (see `bench --help`); "
    "a store holds one method (default: as the store was begun; events for a new store)")
SWEEP_PAIRED = typer.Option(
    None, "--paired/--no-paired", help="time cuBLAS alternately with each kernel, the baseline of its "
    "ratio (default: as the store was begun; paired for a new store)")
CONFIRM_METHOD = typer.Option(
    TimingMethod.SUSTAINED, "--method", help="how the passes are timed; sustained (the default) is what a "
    "model's stream of GEMMs gets, and a problem confirmed by it ranks by it")


def timing_options(method: TimingMethod | None, paired: bool | None,
                   begun: TimingScheme | None = None) -> TimingOptions:
    """How a command times its measurements: `method` and `paired` where given, else as the
    store was begun (`begun`, `ResultStore.timing()`), else events, paired."""
    from ..bench import TimingOptions  # torch, with the GPU stage

    begun = begun or TimingScheme(TimingMethod.EVENTS, paired=True)
    return TimingOptions(method=begun.method if method is None else method,
                         paired=begun.paired if paired is None else paired)
