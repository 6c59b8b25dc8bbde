"""Store stage: where measurements live (SQLite by default, PostgreSQL for several hosts)."""

from ._errors import StoreError, StoreGpuMismatchError
from ._migrate import SCHEMA_VERSION, STUDY_CONSTRAINT, STUDY_METRIC, TrialsConverted, convert_trials
from ._open import (
    default_store_url,
    is_compressed_store,
    local_file,
    open_store,
    readable_store,
    resolve_storage,
    store_url_of,
)
from ._row import DamagedRowError, StoredRow
from ._sql import (
    CONFIRM_STUDY,
    LEGACY_TIMING,
    TUNE_MODEL_STUDY,
    ResultStore,
    open_study_storage,
    read_error,
    shown_url,
    sqlite_url,
)

__all__ = ["CONFIRM_STUDY", "LEGACY_TIMING", "SCHEMA_VERSION", "STUDY_CONSTRAINT", "STUDY_METRIC", "DamagedRowError",
           "ResultStore", "StoreError", "StoreGpuMismatchError", "StoredRow", "TUNE_MODEL_STUDY", "TrialsConverted",
           "convert_trials",
           "default_store_url", "is_compressed_store", "local_file", "open_store", "open_study_storage",
           "read_error", "readable_store", "resolve_storage", "shown_url", "sqlite_url", "store_url_of"]
