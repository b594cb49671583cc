"""``memory://``: a real SQLite store in a private temporary directory that
is gone once the store is closed (nothing survives, as the URL promises)."""

from __future__ import annotations

from cairn.store import dialect, open_store
from cairn.store.contract import Migratable
from cairn.store.records import Durability, NewRun, Payload
from cairn.store.sqlite import SQLiteStore


def test_memory_url_opens_a_throwaway_sqlite_store_removed_on_close() -> None:
    store = open_store("memory://")
    assert isinstance(store, SQLiteStore)
    assert isinstance(store, Migratable)
    assert dialect("memory://") == "memory"  # still reported apart: `cairn db` refuses it
    folder = store.path.parent
    store.create_run(NewRun("r1", "wf", "1", "t", None, Payload(b"x")))
    assert store.get_run("r1") is not None
    assert folder.is_dir()
    store.close()
    assert not folder.exists()
    again = open_store("memory://")
    try:
        assert isinstance(again, SQLiteStore)
        assert again.path.parent != folder
        assert again.get_run("r1") is None
    finally:
        again.close()


def test_memory_url_keeps_the_durability_asked_for() -> None:
    store = open_store("memory://", Durability.POWER)
    try:
        assert store.durability is Durability.POWER
    finally:
        store.close()
