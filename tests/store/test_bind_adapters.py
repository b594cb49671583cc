"""The SQLite store's identity adapters for ``None`` and ``bytes``
(``store/sqlite.py:_bind_without_lookups``): they spare ``sqlite3`` its
adapter search on every history row, bind exactly what was passed, and never
replace an adapter the application registered itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from cairn.store import sqlite as sqlite_store


@pytest.fixture
def registry() -> Iterator[dict[object, object]]:
    """``sqlite3``'s adapter registry, restored after the test."""
    saved = dict(sqlite3.adapters)
    try:
        yield sqlite3.adapters  # type: ignore[misc]
    finally:
        sqlite3.adapters.clear()
        sqlite3.adapters.update(saved)


def test_the_store_binds_none_and_bytes_through_a_registered_identity() -> None:
    # importing the store registered them: the search ends at the registry
    for kind in (type(None), bytes):
        adapter = sqlite3.adapters.get((kind, sqlite3.PrepareProtocol))
        assert adapter is not None, f"no adapter for {kind.__name__}: sqlite3 searches for one per parameter"


def test_the_adapters_bind_the_very_values_passed() -> None:
    conn = sqlite3.connect(":memory:")
    blob = b"\x00\xffpayload\x00"
    row = conn.execute("SELECT ?, typeof(?), ?, typeof(?)", (None, None, blob, blob)).fetchone()
    assert row == (None, "null", blob, "blob")


def test_an_adapter_the_application_registered_is_left_in_place(registry: dict[object, object]) -> None:
    def mine(value: bytes) -> str:
        return value.hex()

    sqlite3.register_adapter(bytes, mine)
    sqlite_store._bind_without_lookups()
    assert registry[(bytes, sqlite3.PrepareProtocol)] is mine
    conn = sqlite3.connect(":memory:")
    assert conn.execute("SELECT ?", (b"\x01\x02",)).fetchone() == ("0102",)
