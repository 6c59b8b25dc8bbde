"""The store's exception classes (raised by every module of the store)."""

from __future__ import annotations

from ..errors import CutlassTuneError


class StoreError(CutlassTuneError):
    """The storage URL is malformed or the store cannot be reached, read or upgraded."""


class StoreGpuMismatchError(StoreError):
    """The store holds results from another GPU model."""
