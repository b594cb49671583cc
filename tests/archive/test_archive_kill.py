"""A process SIGKILLed while it archives or restores a run: the run is
either hot or archived, never both or neither (real processes, real SIGKILL,
SQLite and PostgreSQL). The fault points: the object stored and nothing
recorded (``archive.stored``), the hot rows deleted in the uncommitted move
(``archive.deleted``), the rows put back in the uncommitted restore
(``archive.restored``)."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import Payload, RunStatus
from cairn.store.sqlite import SQLiteStore
from tests import processes
from tests.store.contract import FakeClock, claim, ev, finish, new_run

CHILD = textwrap.dedent(
    """
    import sys
    from cairn.store.postgres import PostgresStore
    from cairn.store.sqlite import SQLiteStore

    kind, where, action, run_id = sys.argv[1:5]
    store = SQLiteStore(where) if kind == "sqlite" else PostgresStore(where)
    print("started", flush=True)
    getattr(store, action)(run_id)
    print("done", flush=True)
    """
)


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path
             ) -> Iterator[tuple[str, str, Callable[[], Store]]]:
    if request.param == "sqlite":
        path = str(tmp_path / "cairn.db")
        yield "sqlite", path, lambda: SQLiteStore(path)
    else:
        url: str = request.getfixturevalue("pg_url")
        yield "postgres", url, lambda: PostgresStore(url)


def closed_run(store: Store, run_id: str) -> None:
    clock = FakeClock()
    store.create_run(new_run(run_id, input=Payload(b"in")))
    c = claim(store, run_id)
    step = ev(clock, run_id, c.next_seq, c.run.epoch, payload=Payload(b"p" * 900))  # spilled on SQLite
    store.append(run_id, c.run.epoch, [step])
    finish(store, clock, c, RunStatus.COMPLETED, seq=c.next_seq + 1)


def killed(kind: str, where: str, action: str, run_id: str, point: str, script: Path) -> None:
    script.write_text(CHILD)
    env = {"CAIRN_FAULTS": point, "PYTHONPATH": os.pathsep.join([str(processes.REPO_ROOT / "src"),
                                                                  os.environ.get("PYTHONPATH", "")])}
    child = processes.run(script, [kind, where, action, run_id], env=env, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    assert "started" in child.stdout
    assert "done" not in child.stdout


def hot_or_archived(store: Any, run_id: str, history: list[object]) -> str:
    """Where the run is, checked whole: its entries are in exactly one place and read back the same."""
    record = store.run_archive(run_id)
    hot = store.history_index(run_id) if record is None else []
    raw_hot = store._select("select_history_index", {"run_id": run_id, "after_seq": 0})
    if record is None:
        assert len(hot) == len(history) == len(raw_hot)
    else:
        assert raw_hot == []  # none left behind in the hot table
    assert store.history(run_id) == history
    return "hot" if record is None else "archived"


@pytest.mark.slow
def test_a_kill_mid_archive_or_restore_leaves_the_run_hot_or_archived(
    database: tuple[str, str, Callable[[], Store]], tmp_path: Path,
) -> None:
    kind, where, opener = database
    script = tmp_path / "child.py"
    store = opener()
    try:
        for run_id in ("r1", "r2"):
            closed_run(store, run_id)
        history = {r: store.history(r) for r in ("r1", "r2")}
        killed(kind, where, "archive_run", "r1", "archive.stored", script)
        assert hot_or_archived(store, "r1", history["r1"]) == "hot"
        killed(kind, where, "archive_run", "r1", "archive.deleted", script)
        assert hot_or_archived(store, "r1", history["r1"]) == "hot"
        store.archive_run("r2")
        killed(kind, where, "restore_run", "r2", "archive.restored", script)
        assert hot_or_archived(store, "r2", history["r2"]) == "archived"
        store.restore_run("r2")  # what the dead process did not finish, done
        assert hot_or_archived(store, "r2", history["r2"]) == "hot"
        store.archive_run("r1")  # the orphan object of the first kill is no obstacle
        assert hot_or_archived(store, "r1", history["r1"]) == "archived"
    finally:
        store.close()
