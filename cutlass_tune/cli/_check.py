"""`cutlass-tune check`: what the entries of a table deliver through `cutlass_tune.matmul`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from .._files import write_atomically
from ..errors import CutlassTuneError
from ..regime import SUSTAINED, RegimeSpec
from ..runtime import BestTable
from ._console import figure, out
from ._options import GPU, check_output, user_output


def check(
    source: str = typer.Argument(..., help="best-config table file or bundle (as `load_best`/`BestTable.load` take)"),
    gpu: int = GPU,
    budget_ms: float = typer.Option(2000.0, "--budget-ms", min=1, help="GPU time per entry and mode"),
    output: Path | None = typer.Option(None, "--output", "-o", callback=user_output,
        help="also write each entry's check as JSON lines"),
    regime: str = typer.Option(
        SUSTAINED.name, "--regime", help="what runs between two calls: sustained (back to back, loop and graph "
        "modes), idle-gap:200us, interleaved:64MiB or as-captured:0.7:150us (one mode: each call between CUDA "
        "events, the regime's work outside them)"),
    table_out: Path | None = typer.Option(
        None, "--table-out", callback=user_output, help="write the table with each checked entry's call-site "
        "ratio (the lowest of its modes) and regime in call_site_ratio and call_site_regime, the figure "
        "`min_ratio` is then held against (.csv, .json or .parquet)"),
) -> None:
    """Call every entry of a table through `cutlass_tune.matmul`, back to back and in CUDA
    graphs (or in the regime `--regime` asks), next to torch's own call on the same operands
    (rotating operands, settled clocks), and print the ratio the table claims beside the ratio the
    caller gets, with the SM clock and power it ran at. Fused and scaled entries are called with
    their epilogue's operands and scales, and "strongest" is the graph ratio to the fastest torch
    path of the same math (eager, torch.compile, cuBLASLt's epilogue). Exits 1 when an entry
    delivers more than 2% below its claim (flagged: `--table-out` records what it delivered, and
    `min_ratio` keeps it off where that is below it)."""
    spec = RegimeSpec.parse(regime).for_bench()
    fmt = _table_format(table_out)
    # torch, with the GPU stage: only the commands that measure import it.
    from ..bench import GAP, TimingOptions, check_table, require_gpu

    if output is not None:
        check_output(output, source)
    table = BestTable.load(source)
    require_gpu(gpu)
    modes = ("loop", "graph") if spec == SUSTAINED else (spec.name,)
    rows = Table("problem", "kernel", "claimed", *modes, "strongest", "MHz", "W", "mJ/GEMM", "torch mJ", "",
                 box=None, pad_edge=False)
    flagged = 0
    lines, figures = [], {}
    for c in check_table(table, device=gpu, options=TimingOptions(budget_ms=budget_ms, min_samples=5), regime=spec):
        flagged += c.flagged
        lines.append(c.to_dict())
        if c.call_site_ratio is not None:
            figures[c.problem.name] = (c.call_site_ratio, spec.name)
        shown = {d.mode: f"{d.ratio:.3f} ({d.ratio_low:.3f}-{d.ratio_high:.3f})" for d in c.delivered}
        last = c.delivered[-1] if c.delivered else None
        rows.add_row(c.problem.name, c.kernel, figure(c.claimed, ".3f"),
                     *(shown.get(m, (c.error or "-") if i == 0 else "-") for i, m in enumerate(modes)),
                     figure(last.strongest_ratio if last and last.others else None, ".3f"),
                     figure(last.tuned.sm_mhz if last else None, ".0f"),
                     figure(last.tuned.power_w if last else None, ".0f"),
                     figure(last.tuned.energy_mj if last else None, ".2f"),
                     figure(last.torch.energy_mj if last else None, ".2f"),
                     f"> {GAP:.0%} below claim" if c.flagged else "")
    out.print(rows)
    if output is not None:
        write_atomically(output, lambda f: f.writelines(json.dumps(line) + "\n" for line in lines))
    if table_out is not None:
        from ..report import write_table
        from ..tables import with_call_site

        write_table(with_call_site(table.frame, figures), table_out, fmt, source=source)
        out.print(f"wrote {table_out}: call-site ratios of {len(figures)} entries in regime {spec.name}")
    if flagged:
        out.print(f"{flagged} of {len(lines)} entries deliver more than {GAP:.0%} below the ratio their table claims")
        raise typer.Exit(1)


def _table_format(path: Path | None) -> str:
    """The format of `--table-out` by its suffix; a one-line error for another one."""
    if path is None:
        return ""
    fmt = path.suffix.lstrip(".")
    if fmt not in ("csv", "json", "parquet"):
        raise CutlassTuneError(f"--table-out {path}: expected a .csv, .json or .parquet file")
    return fmt
