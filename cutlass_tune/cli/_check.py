"""`cutlass-tune check`: what the entries of a table deliver through `cutlass_tune.matmul`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from .._files import write_atomically
from ..runtime import BestTable
from ._console import figure, out
from ._options import GPU, check_output, user_output


def check(
    source: str = typer.Argument(..., help="best-config table file or bundle (as `load_best`/`BestTable.load` take)"),
    gpu: int = GPU,
    budget_ms: float = typer.Option(2000.0, "--budget-ms", min=1, help="GPU time per entry and mode"),
    output: Path | None = typer.Option(None, "--output", "-o", callback=user_output,
        help="also write each entry's check as JSON lines"),
) -> None:
    """Call every entry of a table through `cutlass_tune.matmul`, back to back and in CUDA
    graphs, next to torch's own call on the same operands (the sustained regime: rotating
    operands, settled clocks), and print the ratio the table claims beside the ratio the
    caller gets. Fused and scaled entries are called with their epilogue's operands and scales,
    and "strongest" is the graph ratio to the fastest torch path of the same math (eager,
    torch.compile, cuBLASLt's epilogue). Exits 1 when an entry delivers more than 2% below its
    claim."""
    # torch, with the GPU stage: only the commands that measure import it.
    from ..bench import GAP, TimingOptions, check_table, require_gpu

    if output is not None:
        check_output(output, source)
    table = BestTable.load(source)
    require_gpu(gpu)
    rows = Table("problem", "kernel", "claimed", "loop", "graph", "strongest", "mJ/GEMM", "torch mJ", "", box=None,
                 pad_edge=False)
    flagged = 0
    lines = []
    for c in check_table(table, device=gpu, options=TimingOptions(budget_ms=budget_ms, min_samples=5)):
        flagged += c.flagged
        lines.append(c.to_dict())
        shown = {d.mode: f"{d.ratio:.3f} ({d.ratio_low:.3f}-{d.ratio_high:.3f})" for d in c.delivered}
        graph = next((d for d in c.delivered if d.mode == "graph"), None)
        rows.add_row(c.problem.name, c.kernel, figure(c.claimed, ".3f"), shown.get("loop", c.error or "-"),
                     shown.get("graph", "-"), figure(graph.strongest_ratio if graph and graph.others else None, ".3f"),
                     figure(graph.tuned.energy_mj if graph else None, ".2f"),
                     figure(graph.torch.energy_mj if graph else None, ".2f"),
                     f"> {GAP:.0%} below claim" if c.flagged else "")
    out.print(rows)
    if output is not None:
        write_atomically(output, lambda f: f.writelines(json.dumps(line) + "\n" for line in lines))
    if flagged:
        out.print(f"{flagged} of {len(lines)} entries deliver more than {GAP:.0%} below the ratio their table claims")
        raise typer.Exit(1)
