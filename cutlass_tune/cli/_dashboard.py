"""`cutlass-tune dashboard`: one self-contained HTML report of a store."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer

from ..store import resolve_storage
from ._console import out
from ._options import READ_DEFAULT, check_output, user_output


def dashboard(
    storage: str | None = typer.Option(
        None, "--storage", help=f"store URL or .sqlite (or .sqlite.gz) file ({READ_DEFAULT})"),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", callback=user_output,
        help="HTML file to write"),
    open_: bool = typer.Option(False, "--open", help="open the report in the default web browser"),
) -> None:
    """Write one self-contained interactive HTML report of a sweep's store (viewing it needs no
    network): best kernel vs cuBLAS, TFLOP/s by knob, search history, importances, failures."""
    from ..report import write_dashboard  # plotly, which only the dashboard uses

    source = resolve_storage(storage)
    report = write_dashboard(source, check_output(output, source))
    out.print(f"wrote {report.path}: {len(report.problems)} problems, {report.measurements} measurements "
              f"from {report.storage}")
    if open_:
        webbrowser.open(report.path.resolve().as_uri())
