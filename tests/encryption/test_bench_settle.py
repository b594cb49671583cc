"""The counted child of ``bench.encryption --instructions`` settles each mode
alike: with encryption on its SQLite store is wrapped in a sealed store, and
``bench.callcount.settle`` must still turn that store's WAL auto-checkpoints
off, as it does with encryption off. Until 2026-12-06 it did so only for a
bare SQLite store: a checkpoint fell into the "on" count's larger window and
none into "off"'s (about 5,300 instructions a run counted on "on" alone).
Only what ``settle`` sets is checked here; nothing is timed or counted."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.callcount import settle
from bench.encryption import make


@pytest.fixture
def collector_restored() -> Iterator[None]:
    """``settle`` freezes and disables the garbage collector (for a counted child, which exits after)."""
    yield
    gc.unfreeze()
    gc.enable()


@pytest.mark.parametrize("sealed", [False, True], ids=["off", "on"])
def test_settle_turns_auto_checkpoints_off_in_either_mode(tmp_path: Path, sealed: bool,
                                                          collector_restored: None) -> None:
    app, _, three = make(tmp_path / "x.db", sealed, lease_seconds=3600.0)
    try:
        app.run(three)
        store = app.store.inner if sealed else app.store  # type: ignore[attr-defined]
        assert type(app.store).__name__ == ("SealedStore" if sealed else "SQLiteStore")
        conn = store._writer_conn()  # where every commit runs, and so where checkpoints start
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] > 0  # SQLite's default: 1000 pages
        signal = str(tmp_path / "signal")
        Path(signal + ".go").touch()  # already given: settle returns at once
        settle(app.store, signal)
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        assert Path(signal + ".ready").exists()
    finally:
        app.close()
