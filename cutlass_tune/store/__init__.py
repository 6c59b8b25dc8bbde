"""Store stage: where measurements live (SQLite by default, PostgreSQL for several hosts)."""

from ._sql import ResultStore, StoreError, StoreGpuMismatchError, default_store_url, open_study_storage, store_url_of

__all__ = ["ResultStore", "StoreError", "StoreGpuMismatchError", "default_store_url", "open_study_storage",
           "store_url_of"]
