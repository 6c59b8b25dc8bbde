"""Report stage: best-config tables built from a store, the files the tuner hands on (tables
and bundles), dashboards. Reading tables and bundles and running their kernels is the runtime's
(`cutlass_tune.tables`, `cutlass_tune.runtime`)."""

from ._best import load_best, load_candidates
from ._export import BundleSummary, same_file, write_bundle, write_table

__all__ = ["BundleSummary", "DashboardError", "build_dashboard", "load_best", "load_candidates", "same_file",
           "write_bundle", "write_dashboard", "write_table"]


_DASHBOARD = ("DashboardError", "build_dashboard", "write_dashboard")


def __getattr__(name: str):
    # plotly loads only for the dashboard: building and writing tables does not need it.
    if name in _DASHBOARD:
        from . import _dashboard

        return getattr(_dashboard, name)
    raise AttributeError(f"module 'cutlass_tune.report' has no attribute {name!r}")
