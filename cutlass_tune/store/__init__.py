"""Store stage: where measurements live (SQLite by default, PostgreSQL for several hosts)."""

from ._sql import ResultStore, StoreError, StoreGpuMismatchError, default_store_url

__all__ = ["ResultStore", "StoreError", "StoreGpuMismatchError", "default_store_url"]
