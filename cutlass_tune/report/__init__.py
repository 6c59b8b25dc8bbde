"""Report stage: best-config tables, the tuned matmul, dashboards."""

from ._dashboard import DashboardError, build_dashboard, write_dashboard
from ._best import COLUMNS, BestTable, BestTableError, Match, load_best, write_table
from ._matmul import Gemm, MatmulInputError, matmul, problem_of

__all__ = ["BestTable", "BestTableError", "COLUMNS", "DashboardError", "build_dashboard", "write_dashboard", "Gemm", "Match", "MatmulInputError", "load_best",
           "matmul", "problem_of", "write_table"]
