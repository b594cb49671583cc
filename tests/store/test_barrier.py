"""The SQLite effect barrier in the ``process`` mode: an ordinary commit,
then one fdatasync of the write-ahead log, so the intent (and every commit
before it) is on stable storage before the side effect runs.

What reaches the disk cannot be observed without pulling the power, so this
records the real sync calls (each still runs) and checks which file they
flushed and that the entry was committed by then."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from cairn.store import sqlite as sqlite_store
from cairn.store.records import Durability, EventType, HistoryEvent, NewRun, Payload
from cairn.store.sqlite import SQLiteStore


def _entry(seq: int, epoch: int, position: int) -> HistoryEvent:
    return HistoryEvent(run_id="r1", seq=seq, event=EventType.OP_INTENT, at=0.0, epoch=epoch, worker="w",
                        position=position, step_kind="tool", name="pay", detail={"operation_id": "op"})


def test_barrier_syncs_the_wal_after_committing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "b.db"
    store = SQLiteStore(path, durability=Durability.PROCESS)
    synced: list[tuple[int, int]] = []  # (inode synced, history entries committed at that moment)
    real = sqlite_store._fdatasync

    def recording(fd: int) -> None:
        reader = sqlite3.connect(path)
        try:
            committed = reader.execute("SELECT count(*) FROM history").fetchone()[0]
        finally:
            reader.close()
        synced.append((os.fstat(fd).st_ino, committed))
        real(fd)

    monkeypatch.setattr(sqlite_store, "_fdatasync", recording)
    try:
        claim = store.create_claimed_run(NewRun("r1", "wf", "1", "t", None, Payload(b"x")), "w", 30)
        assert claim is not None
        epoch, seq = claim.run.epoch, claim.next_seq
        store.append("r1", epoch, [_entry(seq, epoch, 0)])
        assert synced == []  # an ordinary append: no sync
        store.append("r1", epoch, [_entry(seq + 1, epoch, 1)], barrier=True)
        wal = os.stat(f"{path}-wal").st_ino
        assert synced == [(wal, seq + 1)]  # the WAL, once, with the intent already committed
        store.append("r1", epoch, [_entry(seq + 2, epoch, 2), _entry(seq + 3, epoch, 3)], barrier=True)
        assert synced[1:] == [(wal, seq + 3)]
    finally:
        store.close()


def test_power_mode_needs_no_extra_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """synchronous=FULL already syncs every commit."""
    store = SQLiteStore(tmp_path / "p.db", durability=Durability.POWER)
    calls: list[int] = []
    monkeypatch.setattr(sqlite_store, "_fdatasync", calls.append)
    try:
        claim = store.create_claimed_run(NewRun("r1", "wf", "1", "t", None, Payload(b"x")), "w", 30)
        assert claim is not None
        store.append("r1", claim.run.epoch, [_entry(claim.next_seq, claim.run.epoch, 0)], barrier=True)
        assert calls == []
        assert store.history("r1")[-1].event is EventType.OP_INTENT
    finally:
        store.close()
