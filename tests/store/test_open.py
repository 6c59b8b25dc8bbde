"""What `--storage` names: one opener resolves and checks it for every command."""

from pathlib import Path

import pytest

from cutlass_tune import settings
from cutlass_tune.store import StoreError, local_file, open_store, resolve_storage, store_url_of

REPO = Path(__file__).resolve().parents[2]


def test_sources_become_urls_or_stay_files():
    assert store_url_of("results/x.sqlite") == "sqlite:///results/x.sqlite"
    assert store_url_of("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert store_url_of("best.csv") is None
    assert local_file("sqlite:///results/x.db") == Path("results/x.db")
    assert local_file("best.csv") == Path("best.csv")
    for remote in ("postgresql+psycopg://u@h/db", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"):
        assert local_file(remote) is None


def test_the_default_store_is_the_settings_and_must_be_here(tmp_path, monkeypatch):
    assert resolve_storage("given.csv") == "given.csv"
    monkeypatch.chdir(REPO)
    assert resolve_storage(None) == settings.DEFAULT_STORE
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=f"^give --storage: the default store {settings.DEFAULT_STORE} is not here"):
        resolve_storage(None)
    monkeypatch.setenv("CUTLASS_TUNE_STORE", "postgresql+psycopg://u@h/db")
    assert resolve_storage(None) == "postgresql+psycopg://u@h/db"  # a server is not looked for here


def test_reading_a_store_that_is_not_there_makes_nothing(tmp_path):
    # Guards against a read creating an empty SQLite file (and its folder) where none was.
    missing = tmp_path / "none" / "s.sqlite"
    with pytest.raises(StoreError, match=f"^no store at sqlite:///{missing}$"):
        open_store(missing)
    assert list(tmp_path.iterdir()) == []
    open_store(missing, new=True)  # a sweep's new store: made by its first write, not here
    assert list(tmp_path.iterdir()) == []


def test_a_table_file_is_not_a_store(tmp_path):
    with pytest.raises(StoreError, match=r"^--storage t\.csv: expected a store URL or a \.sqlite file$"):
        open_store("t.csv")
