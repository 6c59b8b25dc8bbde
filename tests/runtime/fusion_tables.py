"""Best tables of fused tn problems for the fusion tests (patch, the Inductor pass, capture):
rows that name what `_Coverage` reads, without kernels to run (off CUDA the operators compute
torch's math)."""

from collections.abc import Iterable

import pandas as pd

from cutlass_tune.runtime import BestTable


def fused_table(entries: Iterable[tuple[str, int, int, float]], dtype: str = "bf16", m: int = 128,
                median_ms: float | None = None) -> BestTable:
    """One tn row per (epilogue, N, K, ratio) of `dtype` at M = `m`; its kernel's `median_ms`
    where given (else the table knows no time)."""
    rows = [{"gpu": "", "problem": f"{m}x{n}x{k}_{dtype}{dtype}{dtype}_tn", "m": m, "n": n, "k": k,
             "dtype_a": dtype, "dtype_b": dtype, "dtype_d": dtype, "layout": "tn", "epilogue": epilogue,
             "scaling": "none", "ratio": ratio, **({} if median_ms is None else {"median_ms": median_ms})}
            for epilogue, n, k, ratio in entries]
    return BestTable(pd.DataFrame(rows))
