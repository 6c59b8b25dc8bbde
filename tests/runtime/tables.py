"""Best-config tables for the model tests (operator, Linear, patch): small table files of chosen
shapes for the CPU, the committed stores' tuned kernels for the GPU."""

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from cutlass_tune.runtime import BestTable

TEMPLATE = Path(__file__).resolve().parents[1] / "report" / "data" / "best-v2.csv"
RESULTS = Path(__file__).resolve().parents[2] / "results"
_LAYOUTS = {"tn": ("row", "col"), "tt": ("row", "row"), "nt": ("col", "row"), "nn": ("col", "col")}


def csv_table(path: Path, entries: Iterable[tuple[str, str, int, int, int]]) -> BestTable:
    """A table file written at `path` (.csv) and read back by `BestTable.load`: one row per
    (dtype, layout, m, n, k), each the first row of tests/report/data/best-v2.csv with that
    problem (its config's types and layouts changed to match)."""
    template = pd.read_csv(TEMPLATE, dtype=str).iloc[0]
    rows = []
    for dtype, layout, m, n, k in entries:
        config = json.loads(template["config"])
        config.update(dtype_a=dtype, dtype_b=dtype, dtype_c=dtype, dtype_d=dtype,
                      layout_a=_LAYOUTS[layout][0], layout_b=_LAYOUTS[layout][1])
        rows.append({**template.to_dict(), "problem": f"{m}x{n}x{k}_{dtype}{dtype}{dtype}_{layout}", "m": m, "n": n,
                     "k": k, "dtype_a": dtype, "dtype_b": dtype, "dtype_d": dtype, "layout": layout,
                     "config": json.dumps(config, sort_keys=True)})
    pd.DataFrame(rows).to_csv(path, index=False)
    return BestTable.load(path)


def tuned_table() -> BestTable:
    """Kernels tuned on an H200, compiled on first use (nvcc): bf16 tn at 1024, 4096 and 8192
    cubed (sweep-nvidia-h200), and bf16 and f16 nn, nt and tt from 1024 to 8192 cubed
    (layouts-squares-nvidia-h200): a Linear of 1024 features finds tuned kernels for its
    forward (tn) and both GEMMs of its backward (tt for the input, nt for the weight)."""
    stores = ("sweep-nvidia-h200.sqlite", "layouts-squares-nvidia-h200.sqlite")
    return BestTable(pd.concat([BestTable.load(RESULTS / s).frame for s in stores], ignore_index=True))


def grouped_rows(entries: Iterable[tuple[str, str, int, int, int, int]], routing: str = "uniform") -> pd.DataFrame:
    """Best-table rows of grouped problems, one per (dtype, layout, experts, n, k, rows): the first
    row of tests/report/data/best-v2.csv made a cooperative grouped kernel of that operation, as
    `load_best` writes them (grouping, groups, routing beside m = the routed rows; swizzle 1, all a
    grouped kernel takes)."""
    from cutlass_tune.space import KernelConfig, Problem, Routing, cells
    from cutlass_tune.tables import COLUMNS, experts_cells, read_table

    template = read_table(TEMPLATE).iloc[0]
    rows = []
    for dtype, layout, experts, n, k, m in entries:
        config = json.loads(template["config"])
        config.update(dtype_a=dtype, dtype_b=dtype, dtype_c=dtype, dtype_d=dtype, layout_a=_LAYOUTS[layout][0],
                      layout_b=_LAYOUTS[layout][1], grouping="grouped", kernel_schedule="cooperative",
                      tile_m=128, tile_scheduler="persistent")
        cfg = KernelConfig.from_dict(config)
        problem = Problem.experts(experts, n, k, m, routing=Routing(routing), **cfg.operation.operation_fields())
        rows.append({**template.to_dict(), "problem": problem.name, "m": m, "n": n, "k": k, "dtype_a": dtype,
                     "dtype_b": dtype, "dtype_d": dtype, "layout": layout, "kernel": cfg.name,
                     "config_hash": cfg.hash, "config": json.dumps(cfg.to_dict(), sort_keys=True),
                     **cells(cfg), "decomposition": "heuristic", "swizzle": 1, **problem.operation.cells(),
                     **experts_cells(problem)})
    return pd.DataFrame(rows)[list(COLUMNS)]


def weight_grad_table(entries: Iterable[tuple[int, int, int, int, float]], config: object = None) -> BestTable:
    """A table of weight-gradient rows (grouping grouped-k, layout nt, bf16), one per (experts, n, k,
    rows, ratio) with `config` (a `KernelConfig` of that operation; None: a cooperative 128x128x64
    one), naming no GPU: the rows `grouped_weight_grad` and grouped_mm's backward look up."""
    from cutlass_tune.space import Grouping, KernelConfig, Layout, Problem, cells
    from cutlass_tune.tables import experts_cells

    cfg = config if isinstance(config, KernelConfig) else KernelConfig(
        grouping=Grouping.GROUPED_K, layout_a=Layout.COL, layout_b=Layout.ROW, epilogue_source=False)
    rows = []
    for experts, n, k, m, ratio in entries:
        problem = Problem.experts(experts, n, k, m, **cfg.operation.operation_fields())
        rows.append(dict(gpu="", problem=problem.name, m=m, n=n, k=k, kernel=cfg.name, config_hash=cfg.hash,
                         config=json.dumps(cfg.to_dict(), sort_keys=True), **cells(cfg), raster="along_n", splits=1,
                         decomposition="heuristic", swizzle=1, ratio=ratio, **problem.operation.cells(),
                         **experts_cells(problem)))
    return BestTable(pd.DataFrame(rows))
