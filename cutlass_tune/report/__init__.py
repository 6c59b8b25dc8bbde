"""Report stage: best-config tables, the tuned matmul, dashboards."""

from ._best import COLUMNS, BestTable, BestTableError, Match, load_best
from ._bundle import BundledKernel, BundleError, BundleSummary, is_bundle, read_bundle, write_bundle
from ._matmul import Gemm, MatmulInputError, matmul, problem_of
from ._table_file import same_file, write_table

__all__ = ["BestTable", "BestTableError", "BundleError", "BundleSummary", "BundledKernel", "COLUMNS",
           "DashboardError", "Gemm", "Match", "MatmulInputError", "build_dashboard", "is_bundle", "load_best",
           "matmul", "problem_of", "read_bundle", "same_file", "write_bundle", "write_dashboard", "write_table"]


_DASHBOARD = ("DashboardError", "build_dashboard", "write_dashboard")


def __getattr__(name: str):
    # plotly loads only for the dashboard: using tables and the tuned matmul does not need it.
    if name in _DASHBOARD:
        from . import _dashboard

        return getattr(_dashboard, name)
    raise AttributeError(f"module 'cutlass_tune.report' has no attribute {name!r}")
