"""The workspace object collector (``cairn.api.wscollect``), on SQLite and
PostgreSQL, with the store's clock in the test's hands.

What it must never do: delete an object a recorded snapshot of an existing
run needs, including one a snapshot stores (or relies on) while the
collection runs, the race settled by the store's fence (a delete only of a
row still last stored before the collection's time). What it must do:
delete what nothing recorded reaches, once the grace period has passed, and
resume after stopping anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from cairn.api import wscollect
from cairn.api.wscollect import Collector, collect
from cairn.errors import WorkspaceError
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, Payload, RunStatus
from cairn.store.sqlite import SQLiteStore
from cairn.workspace import TreeCache, restore, snapshot
from cairn.workspace.objects import CHUNK
from tests.store.contract.helpers import FakeClock, claim, ev, new_run
from tests.workspace.wsapps import root_of

BACKENDS = ("sqlite", "postgres")
HOUR = 3600.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path) -> Iterator[Store]:
    s: Store
    if request.param == "postgres":
        s = PostgresStore(request.getfixturevalue("pg_url"), clock=clock)
    else:
        s = SQLiteStore(tmp_path / "gc.db", clock=clock)
    yield s
    s.close()  # type: ignore[attr-defined]


class Run:
    """A run held by this test: its snapshots stored (fenced) and recorded."""

    def __init__(self, store: Store, clock: FakeClock, run_id: str, tenant: str = "default") -> None:
        self.store, self.clock, self.run_id = store, clock, run_id
        store.create_run(new_run(run_id, tenant=tenant))
        self.epoch = claim(store, run_id).run.epoch
        self.seq = 1 + len(store.history(run_id))
        self.tenant = tenant

    def sink(self, batch: dict[str, bytes]) -> None:
        self.store.put_workspace_objects(self.run_id, self.epoch, batch)

    def record(self, root: str) -> None:
        self.store.append(self.run_id, self.epoch, [ev(self.clock, self.run_id, self.seq, self.epoch,
                                                       position=self.seq, detail={"workspace": root})])
        self.seq += 1


class Source:
    def __init__(self, store: Store, tenant: str = "default") -> None:
        self.store, self.tenant = store, tenant

    def fetch(self, oids: Collection[str]) -> dict[str, bytes]:
        return self.store.workspace_objects(self.tenant, oids)


def stored(store: Store, tenant: str = "default") -> set[str]:
    return set(store.workspace_candidates(tenant, float("inf"), "", 1 << 30))


def restores(store: Store, root: str, dest: Path) -> bool:
    restore(dest, root, Source(store), TreeCache())
    return root_of(dest) == root


def test_only_what_no_recorded_snapshot_reaches_is_collected(store: Store, clock: FakeClock,
                                                            tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "keep.txt").write_text("kept by the recorded snapshot")
    (ws / "big.bin").write_bytes(os.urandom(CHUNK * 2 + 5))  # a chunk list and three blobs
    run = Run(store, clock, "r1")
    cache = TreeCache()
    kept = snapshot(ws, cache, run.sink).root
    run.record(kept)
    (ws / "d" / "scratch.txt").write_text("stored by a snapshot never recorded")
    lost = snapshot(ws, cache, run.sink)
    assert lost.stored == 3  # the new blob, the directory and the root
    before = stored(store)

    clock.advance(HOUR - 1)
    assert collect(store, "default")[0].deleted == 0  # within the grace period: nothing goes
    clock.advance(2)
    done = collect(store, "default")[0]
    assert (done.roots, done.deleted) == (1, 3)
    assert stored(store) == before - lost.sent
    assert restores(store, kept, tmp_path / "check")
    assert collect(store, "default")[0].deleted == 0  # a second pass finds nothing more


def test_a_snapshot_racing_a_collection_keeps_every_object_it_needs(store: Store, clock: FakeClock,
                                                                    tmp_path: Path) -> None:
    """The collection marks, then a snapshot stores again an object the mark
    found unreachable and records a root naming it, then the collection
    sweeps: the object stays (its row was stored again after the
    collection's time, which the delete's condition checks), and the newly
    recorded snapshot restores exactly."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("content an unrecorded snapshot stored an hour ago")
    run = Run(store, clock, "r1")
    orphan = snapshot(ws, TreeCache(), run.sink)  # stored, never recorded
    clock.advance(2 * HOUR)

    gc = Collector(store, "default")
    gc.mark()
    assert gc.live.isdisjoint(orphan.sent)  # the mark found every object of it unreachable

    clock.advance(1)
    racing = snapshot(ws, TreeCache(), run.sink)  # a fresh worker: it stores them all again
    run.record(racing.root)
    assert racing.root == orphan.root

    done = gc.sweep()
    assert done.deleted == 0
    assert orphan.sent <= stored(store)
    assert restores(store, racing.root, tmp_path / "check")


def test_a_sweep_resumes_from_its_cursor_and_from_scratch(store: Store, clock: FakeClock,
                                                          tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    run = Run(store, clock, "r1")
    cache = TreeCache()
    for i in range(30):
        (ws / f"f{i}").write_text(f"version {i}")
    keep = snapshot(ws, cache, run.sink).root
    run.record(keep)
    for i in range(30):
        (ws / f"f{i}").write_text(f"garbage {i}")
    garbage = snapshot(ws, cache, run.sink).sent
    clock.advance(2 * HOUR)

    gc = Collector(store, "default")
    gc.mark()
    page, wscollect.PAGE = wscollect.PAGE, 7  # small pages: the limit stops it midway
    try:
        first = gc.sweep(limit=7)
        assert first.cursor is not None
        assert 0 < first.deleted < len(garbage)
        # a new collection from scratch (a crash lost the cursor) finishes the job
        assert collect(store, "default")[0].deleted == len(garbage) - first.deleted
    finally:
        wscollect.PAGE = page
    assert stored(store).isdisjoint(garbage)
    assert restores(store, keep, tmp_path / "check")


def test_objects_of_a_deleted_run_go_and_other_tenants_are_untouched(store: Store, clock: FakeClock,
                                                                     tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("same bytes, two tenants")
    a = Run(store, clock, "ra", tenant="acme")
    b = Run(store, clock, "rb", tenant="globex")
    root_a = snapshot(ws, TreeCache(), a.sink).root
    root_b = snapshot(ws, TreeCache(), b.sink).root
    a.record(root_a)
    b.record(root_b)
    store.finish_run("ra", a.epoch, ev(clock, "ra", a.seq, a.epoch, EventType.RUN_COMPLETED),
                     RunStatus.COMPLETED, Payload(data=b'"ok"'), None)
    clock.advance(2 * HOUR)
    assert store.prune_runs(clock() - HOUR) == 1
    done = {c.tenant: c for c in collect(store)}
    assert done["acme"].deleted == 2  # the file's blob and the root tree
    assert done["globex"].deleted == 0
    assert stored(store, "acme") == set()
    restore(tmp_path / "check", root_b, Source(store, "globex"), TreeCache())
    assert root_of(tmp_path / "check") == root_b


def test_a_recorded_snapshot_with_a_missing_object_stops_the_collection(store: Store, clock: FakeClock,
                                                                       tmp_path: Path) -> None:
    """An incomplete mark must delete nothing: a tree it cannot read could
    reach any object."""
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("x")
    run = Run(store, clock, "r1")
    run.record(snapshot(ws, TreeCache(), run.sink).root)
    run.record("ab" * 32)  # names a tree that was never stored
    (ws / "d" / "f").write_text("garbage")
    snapshot(ws, TreeCache(), run.sink)
    clock.advance(2 * HOUR)
    before = stored(store)
    with pytest.raises(WorkspaceError, match="not stored"):
        collect(store, "default")
    assert stored(store) == before


def test_a_cache_forgets_what_an_unrecorded_snapshot_stored(store: Store, clock: FakeClock,
                                                            tmp_path: Path) -> None:
    """A worker whose snapshot was stored but never recorded (its entry
    failed to commit) revokes those objects (``RunWorkspace.abandon``): the
    collector may delete them, so the next snapshot of the same files stores
    them again instead of trusting its cache, and its recorded root restores."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("the step's output")
    run = Run(store, clock, "r1")
    cache = TreeCache()
    lost = snapshot(ws, cache, run.sink)  # never recorded
    cache.revoke(lost.sent)
    clock.advance(2 * HOUR)
    assert collect(store, "default")[0].deleted == len(lost.sent)
    again = snapshot(ws, cache, run.sink)
    assert again.sent == lost.sent
    run.record(again.root)
    assert restores(store, again.root, tmp_path / "check")
