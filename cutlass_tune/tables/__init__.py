"""Best-config tables as the tuner hands them on: their columns, table files and bundles.

The tuner writes them (`cutlass_tune.report`); the runtime reads them (`cutlass_tune.runtime`),
on a serving host too: nothing here imports the store, the search or torch.
"""

from ._bundle import (
    BUNDLE_FORMAT,
    MANIFEST,
    TABLE,
    BundledKernel,
    BundleError,
    is_bundle,
    read_bundle,
    read_local,
    sha256_of,
)
from ._file import TABLE_SUFFIXES, check_row, read_table
from ._schema import (
    COLUMNS,
    DISPATCH_COLUMNS,
    EXPERTS_COLUMNS,
    KNOB_COLUMNS,
    LATER_KNOBS,
    NO_ROUTING,
    PROFILER_RANGE,
    REGIME_COLUMNS,
    REGIME_FIGURES,
    BestTableError,
    experts_cells,
    regime_figures,
    regime_text,
    with_call_site,
)

__all__ = ["BUNDLE_FORMAT", "BestTableError", "BundleError", "BundledKernel", "COLUMNS", "DISPATCH_COLUMNS",
           "EXPERTS_COLUMNS", "KNOB_COLUMNS", "LATER_KNOBS", "MANIFEST", "NO_ROUTING", "PROFILER_RANGE",
           "REGIME_COLUMNS",
           "REGIME_FIGURES", "TABLE", "TABLE_SUFFIXES", "check_row", "experts_cells", "is_bundle", "read_bundle",
           "read_local", "read_table", "regime_figures", "regime_text", "sha256_of", "with_call_site"]
