"""`cutlass-tune space`: count the configs of a search-space file or of --shapes, as a sweep would search them."""

from __future__ import annotations

import logging
from pathlib import Path

import typer
from rich.table import Table

from ..errors import CutlassTuneError
from ..space import sweep_space
from ._console import err, out
from ._options import DTYPE, EPILOGUE, LAYOUT, ROUTING, SCALING, SHAPES, SPACE_FILE

log = logging.getLogger(__name__)


def space(config: Path | None = SPACE_FILE, shapes: str | None = SHAPES, dtype: str | None = DTYPE,
          layout: str | None = LAYOUT, epilogue: str | None = EPILOGUE, scaling: str | None = SCALING,
          routing: str | None = ROUTING,
          list_: bool = typer.Option(False, "--list", help="show every config and why it is invalid")) -> None:
    """Count the configs a sweep with the same file or --shapes would search: total, valid,
    invalid by reason."""
    if config is None and shapes is None:
        raise CutlassTuneError("space: give a search-space file or --shapes MxNxK[,MxNxK...]")
    sp = sweep_space(config, shapes, dtype, layout, epilogue, scaling, routing)
    log.info("counting the configs of %s (%d problems)", sp.path, len(sp.problems))
    if sp.auto and logging.getLogger().getEffectiveLevel() < logging.ERROR:  # not under --quiet
        # The walk of kernels: auto takes seconds per operation: say what runs before it does.
        err.print(f"counting the {sum(k.total for k in sp.auto):,} configs of kernels: auto for "
                  f"{len(sp.auto)} operation{'s' if len(sp.auto) > 1 else ''} "
                  f"({', '.join(k.operation.name for k in sp.auto)}): seconds each")
    census = sp.census()  # kernels: auto is counted without listing its millions
    out.print(f"{sp.path}: {len(sp.problems)} problems, {census.total} configs: "
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
