"""SQLiteStore's one write connection (issue 24, 2026-12-07 evening).

Every write of a store's threads runs on the connection its writer lock
guards: writers taking turns on a connection each made every one of them
drop its page cache at its next transaction. What the move must keep: a
read inside a write sees that write; a thread's reads stay on its own
connection; and a wake-up owed by one write's commit is sent even when
another thread's write takes the lock before it goes out.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import new_run


def test_writes_of_every_thread_run_on_the_one_write_connection(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "w.db")
    try:
        written: list[str] = []
        store._writer_conn().set_trace_callback(written.append)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: store.create_run(new_run(f"r{i}")), range(12)))
        store._writer_conn().set_trace_callback(None)
        inserts = [s for s in written if s.startswith("INSERT INTO runs")]
        assert {i for i in range(12) if any(f"'r{i}'" in s for s in inserts)} == set(range(12))
        assert all(store.get_run(f"r{i}") is not None for i in range(12))
    finally:
        store.close()


def test_a_read_inside_a_write_sees_it_and_a_read_outside_does_not(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db")
    try:
        store.create_run(new_run("before"))
        seen_outside: list[str] = []
        with store._write() as tx:
            tx.execute("UPDATE runs SET workflow = 'renamed' WHERE run_id = 'before'")
            # this thread, inside the write: the write's connection and its uncommitted row
            assert workflow(store) == "renamed"
            other = threading.Thread(target=lambda: seen_outside.append(workflow(store)))
            other.start()
            other.join()
        # another thread read the last commit, on its own connection, while the write was open
        assert seen_outside == [new_run("before").workflow]
        assert workflow(store) == "renamed"
    finally:
        store.close()


def workflow(store: SQLiteStore) -> str:
    run = store.get_run("before")
    assert run is not None
    return run.workflow


class _HookedLock:
    """The store's writer lock, calling ``hook`` once right after a release."""

    def __init__(self, lock: Any, hook: Any) -> None:
        self.lock, self.hook = lock, hook

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return bool(self.lock.acquire(*args, **kwargs))

    def release(self) -> None:
        self.lock.release()
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()


def test_a_wake_up_owed_by_a_commit_survives_the_next_writer(tmp_path: Path) -> None:
    """The commit that made a run runnable owes other processes a wake-up;
    another thread's write that takes the lock between that commit and the
    wake-up (and clears the connection's mark as it begins) must not eat it."""
    store = SQLiteStore(tmp_path / "k.db")
    try:
        store.create_run(new_run("warm"))  # the write connection open, its triggers installed
        woken: list[int] = []
        store._waker.wake = lambda: woken.append(1)  # type: ignore[method-assign]

        def another_write() -> None:
            def write() -> None:
                with store._write() as tx:
                    tx.execute("SELECT 1")
            t = threading.Thread(target=write)
            t.start()
            t.join()

        store._writer = _HookedLock(store._writer, another_write)  # type: ignore[assignment]
        store.create_run(new_run("now"))  # runnable now: its commit owes a wake-up
        assert woken == [1]
    finally:
        store.close()


def test_reclaim_space_turns_secure_delete_on_where_the_deletes_run(tmp_path: Path) -> None:
    """What this store deletes after ``reclaim_space`` is zeroed: the pragma
    set on the write connection, not on a reading thread's."""
    store = SQLiteStore(tmp_path / "s.db")
    try:
        store.create_run(new_run("r"))
        store._writer_conn().execute("PRAGMA secure_delete = OFF")  # a build without it on by default
        assert store.reclaim_space()["vacuumed"]
        assert store._writer_conn().execute("PRAGMA secure_delete").fetchone()[0] == 1
    finally:
        store.close()


@pytest.mark.slow
def test_a_forked_child_writes_on_its_own_connection(tmp_path: Path) -> None:
    """Every thread's writes share one connection; a connection never crosses
    a fork, so a child forked with the store open opens its own (and a writer
    lock held by another thread of the parent at the fork does not hang it)."""
    store = SQLiteStore(tmp_path / "f.db")
    try:
        store.create_run(new_run("parent"))
        parents = id(store._writer_conn())
        holding, release = threading.Event(), threading.Event()

        def hold_the_lock() -> None:
            with store._holding_writer():
                holding.set()
                release.wait(10)

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        holding.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: exit status says what it found
            code = 1
            try:
                store.create_run(new_run("child"))
                code = 0 if id(store._writer_conn()) != parents else 2
            finally:
                os._exit(code)
        release.set()
        holder.join()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store.get_run("child") is not None
        store.create_run(new_run("parent again"))  # the parent's connection still writes
    finally:
        store.close()
