"""SQLite wake-ups across processes (``cairn.store.wakeups``): a commit that
makes a run runnable reaches every listener; nothing else wakes anyone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.store.records import Claim, EventType, HistoryEvent
from cairn.store.sqlite import SQLiteStore
from cairn.store.wakeups import wake_directory
from tests.store.contract import claim, new_run


def _suspended(held: Claim) -> HistoryEvent:
    return HistoryEvent(run_id=held.run.run_id, seq=held.next_seq, event=EventType.RUN_SUSPENDED,
                        at=time.time(), epoch=held.run.epoch, worker="w1")


class Listener:
    def __init__(self, store: SQLiteStore) -> None:
        self.count = 0
        self.event = threading.Event()
        self.stop = store.listen(self._woken)
        assert self.wait(), "listen() calls back once at the start"

    def _woken(self) -> None:
        self.count += 1
        self.event.set()

    def wait(self, timeout: float = 5.0) -> bool:
        woken = self.event.wait(timeout)
        self.event.clear()
        return woken


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[SQLiteStore, SQLiteStore]]:
    writer, reader = SQLiteStore(tmp_path / "cairn.db"), SQLiteStore(tmp_path / "cairn.db")
    yield writer, reader
    writer.close()
    reader.close()


def test_a_new_run_and_a_delivery_wake_a_listener_of_another_store(
    stores: tuple[SQLiteStore, SQLiteStore],
) -> None:
    writer, reader = stores
    listener = Listener(reader)
    writer.create_run(new_run("r1"))
    assert listener.wait()
    held = claim(writer, "r1")
    assert not listener.wait(0.2)  # a claim makes nothing runnable
    writer.suspend_run("r1", held.run.epoch, _suspended(held),
                       None, None, waiting_for="signal:go")
    assert not listener.wait(0.2)  # parked for a signal: nothing to claim
    writer.deliver("r1", "signal:go", None)
    assert listener.wait()
    listener.stop()


def test_a_stopped_listener_is_called_no_more_and_its_socket_is_gone(
    stores: tuple[SQLiteStore, SQLiteStore], tmp_path: Path,
) -> None:
    """``stop`` wakes the listener's thread (it does not wait out its receive
    timeout) and that wake-up, like any after it, calls nobody back."""
    writer, reader = stores
    listener = Listener(reader)
    directory = wake_directory(tmp_path / "cairn.db")
    assert len(list(directory.glob("*.sock"))) == 1
    listener.stop()
    writer.create_run(new_run("r1"))
    assert not listener.wait(0.3)
    assert listener.count == 1  # the call at the start only
    assert list(directory.glob("*.sock")) == []


def test_a_timer_set_for_later_wakes_nobody(stores: tuple[SQLiteStore, SQLiteStore]) -> None:
    writer, reader = stores
    writer.create_run(new_run("r1"))
    held = claim(writer, "r1")
    listener = Listener(reader)
    writer.suspend_run("r1", held.run.epoch, _suspended(held),
                       time.time() + 3600, None)
    assert not listener.wait(0.3)
    listener.stop()


def test_a_rolled_back_write_wakes_nobody(stores: tuple[SQLiteStore, SQLiteStore]) -> None:
    writer, reader = stores
    listener = Listener(reader)

    def insert_then_abort() -> None:
        with writer._write() as tx:
            tx.execute("INSERT INTO runs (run_id, workflow, workflow_version, tenant, status, epoch, "
                       "recoveries, queue, priority, created_at, updated_at, runnable_at) VALUES "
                       "('x', 'wf', '1', 't', 'pending', 0, 0, 'default', 0, 0, 0, 0)")
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError):
        insert_then_abort()
    assert writer.get_run("x") is None
    assert not listener.wait(0.3)
    listener.stop()


@pytest.mark.slow
def test_the_socket_of_a_dead_listener_is_removed_by_the_next_sender(
    stores: tuple[SQLiteStore, SQLiteStore], tmp_path: Path
) -> None:
    writer, _ = stores
    directory = wake_directory(tmp_path / "cairn.db")
    directory.mkdir(exist_ok=True)
    # a worker SIGKILLed while listening leaves its bound socket file behind
    code = ("import socket, os, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
            "s.bind(sys.argv[1]); os.kill(os.getpid(), 9)")
    stale = directory / "dead.sock"
    subprocess.run([sys.executable, "-c", code, str(stale)], check=False)
    assert stale.exists()
    writer.create_run(new_run("r1"))
    assert not stale.exists()


def test_a_long_database_path_gets_a_short_socket_directory(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90) / "cairn.db"
    directory = wake_directory(deep)
    assert len(str(directory)) < 70
    assert wake_directory(deep) == directory  # every process computes the same one
    store = SQLiteStore(deep)
    try:
        listener = Listener(store)
        other = SQLiteStore(deep)
        other.create_run(new_run("r1"))
        assert listener.wait()
        listener.stop()
        other.close()
    finally:
        store.close()
    assert not any(name.endswith(".sock") for name in os.listdir(directory))


def test_a_full_listener_does_not_block_the_sender(stores: tuple[SQLiteStore, SQLiteStore]) -> None:
    writer, _ = stores
    directory = writer._waker.directory
    directory.mkdir(exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(directory / "sleepy.sock"))  # never reads
    try:
        started = time.monotonic()
        for i in range(2000):
            writer.create_run(new_run(f"r{i}"))
        assert time.monotonic() - started < 60
        assert (directory / "sleepy.sock").exists()  # alive, merely full: kept
    finally:
        sock.close()


def test_a_store_that_cannot_bind_a_socket_falls_back_to_polling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(tmp_path / "cairn.db")
    try:
        wake_directory(tmp_path / "cairn.db").write_text("not a directory")
        stop = store.listen(lambda: None)  # no exception: the worker starts and polls
        stop()
        assert "polling only" in caplog.text
    finally:
        store.close()
