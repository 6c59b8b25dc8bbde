"""`cutlass-tune upgrade`: bring a store to this version's schema."""

from __future__ import annotations

import typer

from ..errors import CutlassTuneError
from ..store import convert_trials, open_store, resolve_storage
from ._console import out


def upgrade(
    storage: str = typer.Option(..., "--storage", help="store URL or .sqlite file (required: never the default "
                                                       "store, which a checkout ships)"),
) -> None:
    """Upgrade a store to this version's schema (sweep and confirm do it on their own, before
    their first write; reports read older stores as they are), and its Optuna trials to what this
    version writes (invalid configs pruned, not complete at 0 TFLOP/s; the metric named). Copy
    the store first to keep a way back: upgraded, versions before this one refuse it."""
    if not storage.strip():  # resolve_storage would take an empty one for the default store
        raise CutlassTuneError("--storage '': give the store to upgrade")
    store = open_store(resolve_storage(storage))
    before = store.upgrade()
    now = store.schema()
    out.print(f"the store {store.shown} is at schema {now} already" if before == now
              else f"upgraded the store {store.shown} from schema {before} to {now}")
    converted = convert_trials(store.engine, store.shown)
    if converted:
        out.print(f"converted its Optuna trials: {converted.pruned} of invalid configs from COMPLETE at 0 to "
                  f"PRUNED, {converted.failed} other COMPLETE at 0 to FAIL; {converted.explained} without a reason "
                  f"marked so; named the metric of {converted.named} studies")
