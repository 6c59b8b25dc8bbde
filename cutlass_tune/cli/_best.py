"""`cutlass-tune best`: the best verified kernel per problem and GPU."""

from __future__ import annotations

import enum
import io
import sys
from pathlib import Path

import typer
from rich.table import Table

from .._files import write_atomically
from ..errors import CutlassTuneError
from ..measurement import Baseline
from ..report import load_best, write_table
from ..space import Operation
from ..store import resolve_storage
from ..tables import COLUMNS, regime_text
from ._console import PlainConsole, figure, out, visible
from ._options import READ_DEFAULT, check_output, user_output


class TableFormat(str, enum.Enum):
    """How `best` writes its table."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"
    PARQUET = "parquet"


def best(
    storage: str | None = typer.Option(
        None, "--storage", help=f"store URL, .sqlite or .sqlite.gz file, best-config table or bundle ({READ_DEFAULT})"),
    fmt: TableFormat = typer.Option(TableFormat.TABLE, "--format", help="how to write the table"),
    output: Path | None = typer.Option(None, "--output", "-o", callback=user_output,
        help="write to FILE instead of the screen"),
    wide: bool = typer.Option(False, "--wide", help="every column on a terminal too narrow for them (a pipe "
                              "or file always gets them all)"),
) -> None:
    """The best verified kernel per problem and GPU: TFLOP/s, its baseline (cuBLAS, torch eager of a
    fused problem, torch._grouped_mm of a grouped one) and the ratio to it in the same run, spread,
    and the full config.

    A terminal too narrow for every column gets the essential ones (problem, ratio, TFLOP/s, kernel),
    one line a row; --wide shows them all. Names are never cut."""
    source = resolve_storage(storage)
    if output is not None:
        check_output(output, source)
    frame = load_best(source)
    if fmt is TableFormat.TABLE:
        text = _whole(_table(frame))
        if output:
            write_atomically(output, text)
        elif not out.is_terminal or wide or max(map(len, text.splitlines())) <= out.width:
            sys.stdout.write(text)
        else:
            _print_essential(frame)
        return
    if output is None:
        if fmt is TableFormat.PARQUET:
            raise CutlassTuneError("--format parquet needs --output FILE")
        text = (frame.to_csv(index=False) if fmt is TableFormat.CSV
                else frame.to_json(orient="records", indent=1, double_precision=15))
        text = text if text.endswith("\n") else text + "\n"
        # A terminal shows the cells' control characters as escapes; a pipe gets the data as stored.
        sys.stdout.write(visible(text) if sys.stdout.isatty() else text)
        return
    write_table(frame[list(COLUMNS)], output, fmt.value, source=source)
    out.print(f"{len(frame)} rows written to {output}")


def _whole(table: Table) -> str:
    """`table` as text with every cell whole (never wrapped or cut), its lines' trailing blanks
    dropped: what a pipe or file gets (a terminal wraps what passes its edge)."""
    text = io.StringIO()
    PlainConsole(file=text, width=100_000).print(table)
    return "".join(line.rstrip() + "\n" for line in text.getvalue().splitlines())


def _print_essential(frame) -> None:
    """The rows on a terminal too narrow for the table: ratio, TFLOP/s, problem and kernel, one
    line each, names whole (a terminal wraps a line that passes its edge; a copied name stays
    whole), under a heading per GPU where the table holds several."""
    records = frame.to_dict("records")
    width = max([len("problem"), *(len(str(r["problem"])) for r in records)])
    gpus = list(dict.fromkeys(str(r["gpu"]) for r in records))
    out.print(f"{'ratio':>6} {'TFLOP/s':>8}  {'problem':<{width}}  kernel")
    for gpu in gpus:
        if len(gpus) > 1:
            out.print(f"{gpu}:")
        for r in records:
            if str(r["gpu"]) == gpu:
                out.print(f"{figure(r['ratio'], '.3f'):>6} {figure(r['tflops'], '.1f'):>8}  "
                          f"{str(r['problem']):<{width}}  {r['kernel']}", crop=False)
    out.print(f"({len(records)} rows; --wide for every column: GPU, baselines, spread, confirmation, run-time "
              "arguments)", crop=False)


def _table(frame) -> Table:
    """The rows of `load_best` as the screen shows them."""
    records = frame.to_dict("records")
    regimes = [regime_text(r) for r in records]
    shown = ("by regime (ratio, SM clock, power)",) if any(regimes) else ()
    table = Table(box=None, pad_edge=False)
    for name in ("gpu", "problem", "TFLOP/s", "baseline", "its TFLOP/s", "ratio", "spread", "confirmed", "kernel",
                 "run-time", *shown):
        table.add_column(name, no_wrap=True, overflow="ignore")
    for r, regime in zip(records, regimes):
        baseline = Baseline.of(Operation.from_cells(r)).value
        confirmed = (f"{r['confirm_passes']} passes {r['method']}, {r['ratio_low']:.3f}-{r['ratio_high']:.3f} "
                     f"(sweep {r['sweep_ratio']:.3f})" if r["confirm_passes"] else "-")
        table.add_row(r["gpu"], r["problem"], figure(r["tflops"], ".1f"), baseline, figure(r["cublas_tflops"], ".1f"),
                      figure(r["ratio"], ".3f"), figure(r["spread"], ".1%"), confirmed, r["kernel"],
                      r["runtime"], *((regime or "-",) if shown else ()))
    return table
