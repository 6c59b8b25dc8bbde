"""`cutlass-tune space`: count the configs of a search-space file."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from ..space import load_space
from ._console import out
from ._options import CONFIG


def space(config: Path = CONFIG,
          list_: bool = typer.Option(False, "--list", help="show every config and why it is invalid")) -> None:
    """Count the configs a search-space file describes: total, valid, invalid by reason."""
    sp = load_space(config)
    census = sp.census()  # kernels: auto is counted without listing its millions
    out.print(f"{config}: {len(sp.problems)} problems, {census.total} configs: "
              f"{census.valid} valid, {census.total - census.valid} invalid")
    if census.invalid:
        table = Table("rule", "configs", "example reason", box=None, pad_edge=False)
        for rule, count in census.invalid.items():
            table.add_row(rule, str(count), census.examples[rule])
        out.print(table)
    if list_:  # kernels: auto lists its valid configs only
        for cfg, why in sp.classify():
            line = "valid" if not why else "invalid: " + "; ".join(str(w) for w in why)
            out.print(f"{cfg.name}  {cfg.hash}  {line}")
