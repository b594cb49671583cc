"""Attacks on SQLite's pending rows and in-statement fence (issue 24,
2026-12-07 afternoon, branch lgsql): a ``put_writes`` to a checkpoint not
stored yet appends its record to the checkpoint's *pending* row of
``lg_checkpoints`` (``checkpoint_kind`` '', no checkpoint), which the
checkpoint's put fills in; its statements carry the fence (the thread's
holder row) themselves. What is pinned here: a stale writer creates no
pending row, record or value, even at the row's very epoch; no read
returns a pending row (by id, latest, listings with before/filter/limit,
history of every thread), forged ones included; tenants do not share one;
copy, delete_for_runs and prune leave no readable bogus checkpoint and keep
stored checkpoints' writes; a damaged pending record does not block a prune;
concurrent async writes and put on one checkpoint lose nothing; a process
SIGKILLed between a checkpoint's writes and its put resumes to the state an
uninterrupted run reaches, its pending row never read. The fence tests run on
PostgreSQL too (the fallback in ``_lg_operate`` is shared code).

Two bugs these tests found, fixed: a second copy_thread kept the target's
copied pending row instead of the stored checkpoint (lg_copy_checkpoints now
replaces a pending target row); a prune by another saver between a
checkpoint's writes and its put dropped those writes and collected their
values, which the writer's saver still took for stored, so the checkpoint
named a value not stored (before pending rows too, on both backends: a prune
and deleting an older run now keep writes after their namespace's latest
checkpoint)."""

from __future__ import annotations

import asyncio
import operator
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import pytest

import cairn
from cairn.errors import InvalidArgument, ThreadTaken, UnreadableCheckpoint
from tests import processes
from tests.langgraph.rawsql import raw_sql as _sql
from tests.langgraph.test_folded_writes import _put, _writes

if TYPE_CHECKING:
    from cairn.langgraph import CairnSaver

#: pending rows are SQLite's; the fence tests run on both backends (the in-statement fence's fallback,
#: ``_lg_operate``, is shared code)
SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

#: a value long enough to be a row of lg_values (not a literal ref)
LONG = "a pending write's value, attacked " * 4
THREAD = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def _id(n: int) -> str:
    return f"1f0e0000-0000-6000-8000-{n:012d}"


def _at(checkpoint_id: str, thread: str = "t") -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}


def _saver(app: cairn.App, tenant: str = "acme") -> CairnSaver:
    from cairn.langgraph import CairnSaver

    return CairnSaver(app, tenant=tenant)


def _pending(db_url: str) -> list[tuple[Any, ...]]:
    return _sql(
        db_url,
        "SELECT tenant, thread_id, checkpoint_id FROM lg_checkpoints "
        "WHERE checkpoint_kind = '' ORDER BY tenant, thread_id, checkpoint_id",
    )


def _tables(db_url: str) -> tuple[Any, ...]:
    """Everything a refused write could have changed."""
    return tuple(
        _sql(db_url, f"SELECT * FROM {table} ORDER BY 1, 2, 3")
        for table in ("lg_checkpoints", "lg_writes", "lg_values", "lg_blobs", "lg_threads")
    )


def _ids(found: Any) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in found]


# -- the fence ----------------------------------------------------------------------------------


def test_a_thread_freed_and_taken_at_the_same_epoch_refuses_the_old_writer(
    app: cairn.App, db_url: str
) -> None:
    """The old writer's guess (its epoch, 1) is the row's epoch again after a
    delete and a take by another saver: only the owner tells them apart, and
    the old writer's put_writes (a pending row), put and hold write nothing."""
    first = _saver(app)
    c1 = _put(first, None, 0, checkpoint_id=_id(1))
    first.put_writes(_at(_id(2)), [("log", LONG)], "task-a")  # first's own pending row
    _saver(app).delete_thread("t")
    third = _saver(app)
    c1 = _put(third, None, 0, checkpoint_id=_id(1))
    assert _sql(db_url, "SELECT epoch FROM lg_threads") == [(1,)]  # the epoch first guesses
    before = _tables(db_url)
    for checkpoint_id in (_id(1), _id(2), _id(3)):  # stored, never pending, pending no more
        with pytest.raises(ThreadTaken):
            first.put_writes(_at(checkpoint_id), [("log", LONG + checkpoint_id)], "task-b")
    with pytest.raises(ThreadTaken):
        _put(first, c1, 1, checkpoint_id=_id(2))
    with pytest.raises(ThreadTaken):
        first.hold("t")
    assert _tables(db_url) == before
    assert _pending(db_url) == []
    assert _writes(third, c1) == []


def test_an_owner_changed_under_the_same_epoch_is_refused(app: cairn.App, db_url: str) -> None:
    """The holder row rewritten to another owner at the writer's epoch (a
    forged or restored row): the EXISTS fails on the owner, the rule refuses."""
    first = _saver(app)
    _put(first, None, 0, checkpoint_id=_id(1))
    _sql(db_url, "UPDATE lg_threads SET owner = 'intruder'")
    before = _tables(db_url)
    with pytest.raises(ThreadTaken):
        first.put_writes(_at(_id(2)), [("log", LONG)], "task-a")
    with pytest.raises(ThreadTaken):
        first.put_writes(_at(_id(1)), [("log", LONG)], "task-a")
    assert _tables(db_url) == before


def test_a_lease_writer_below_the_rows_lease_writes_no_pending_row(app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import CairnSaver

    old = CairnSaver(app, tenant="acme", lease=3)
    _put(old, None, 0, checkpoint_id=_id(1))
    newer = CairnSaver(app, tenant="acme", lease=4)
    newer.put_writes(_at(_id(2)), [("log", LONG)], "task-new")
    before = _tables(db_url)
    with pytest.raises(ThreadTaken):
        old.put_writes(_at(_id(2)), [("log", LONG + "old")], "task-old")
    with pytest.raises(ThreadTaken):
        old.put_writes(_at(_id(3)), [("log", LONG + "old")], "task-old")
    assert _tables(db_url) == before
    _put(newer, _at(_id(1)), 1, checkpoint_id=_id(2))
    assert _writes(_saver(app), _at(_id(2))) == [("task-new", "log", LONG)]


# -- reads ----------------------------------------------------------------------------------------


@SQLITE
def test_no_read_returns_a_pending_row_even_a_forged_one(app: cairn.App, db_url: str) -> None:
    """Pending rows below, between and above stored checkpoints, and a row
    forged to look pending that carries a real checkpoint body and metadata:
    by id, latest, listings (before, filter, limit, every thread) skip them."""
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(10))
    c2 = _put(saver, c1, 1, checkpoint_id=_id(20))
    for n in (5, 15, 30):
        saver.put_writes(_at(_id(n)), [("log", LONG)], "task")
    _sql(
        db_url,
        "INSERT INTO lg_checkpoints (tenant, thread_id, ns, checkpoint_id, parent_id, run_id, "
        "checkpoint_kind, checkpoint, metadata_kind, metadata, writes) "
        "SELECT tenant, thread_id, ns, ?, parent_id, run_id, '', checkpoint, metadata_kind, "
        "metadata, writes FROM lg_checkpoints WHERE checkpoint_id = ?",
        (_id(40), _id(20)),
    )
    assert len(_pending(db_url)) == 4
    stored = [_id(20), _id(10)]
    for reader in (saver, _saver(app)):
        for n in (5, 15, 30, 40):
            assert reader.get_tuple(_at(_id(n))) is None
            with pytest.raises(InvalidArgument):
                reader.values("t", _id(n))
            assert _ids(reader.list(_at(_id(n)))) == []
        latest = reader.get_tuple(THREAD)
        assert latest is not None
        assert latest.config == c2
        assert _ids(reader.list(THREAD)) == stored
        assert _ids(reader.list(THREAD, limit=1)) == [_id(20)]
        assert _ids(reader.list(THREAD, before=_at(_id(40)))) == stored
        assert _ids(reader.list(THREAD, before=_at(_id(15)))) == [_id(10)]
        assert _ids(reader.list(THREAD, filter={"source": "loop"})) == stored
        assert _ids(reader.list(THREAD, filter={"step": 1}, limit=1)) == [_id(20)]
        assert _ids(reader.list({"configurable": {"thread_id": "t"}})) == stored
        assert _ids(reader.list(None)) == stored
        assert _ids(reader.list(None, filter={"source": "loop"})) == stored


@SQLITE
def test_a_graphs_history_skips_pending_rows(app: cairn.App, db_url: str) -> None:
    from tests.langgraph.graphs import counting_loop

    saver = _saver(app)
    graph = counting_loop(3, "s").compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    graph.invoke({"log": []}, config)
    history = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config)]
    saver.put_writes(_at(_id(1)), [("log", LONG)], "ahead")  # a pending row below all
    saver.put_writes(_at("1fffffff-ffff-6fff-8fff-ffffffffffff"), [("log", LONG)], "ahead")  # above all
    assert [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config)] == history
    assert graph.get_state(config).values == {"log": ["s0", "s1", "s2"]}


@SQLITE
def test_tenants_with_one_thread_and_checkpoint_id_keep_their_own_pending_rows(
    app: cairn.App, db_url: str
) -> None:
    ours, theirs = _saver(app, "acme"), _saver(app, "other")
    for saver, tag in ((ours, "ours"), (theirs, "theirs")):
        _put(saver, None, 0, checkpoint_id=_id(1))
        saver.put_writes(_at(_id(2)), [("log", LONG + tag)], f"task-{tag}")
    assert _pending(db_url) == [("acme", "t", _id(2)), ("other", "t", _id(2))]
    _put(ours, _at(_id(1)), 1, checkpoint_id=_id(2))
    assert _writes(_saver(app, "acme"), _at(_id(2))) == [("task-ours", "log", LONG + "ours")]
    assert _saver(app, "other").get_tuple(_at(_id(2))) is None
    assert _pending(db_url) == [("other", "t", _id(2))]
    ours.prune(["t"])  # acme's prune: not other's pending row
    assert _pending(db_url) == [("other", "t", _id(2))]
    _put(theirs, _at(_id(1)), 1, checkpoint_id=_id(2))
    assert _writes(_saver(app, "other"), _at(_id(2))) == [("task-theirs", "log", LONG + "theirs")]


# -- copy, delete_for_runs, prune --------------------------------------------------------------


@SQLITE
def test_a_copied_thread_has_no_readable_pending_row(app: cairn.App, db_url: str) -> None:
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(1))
    saver.put_writes(c1, [("log", LONG)], "task-a")
    saver.put_writes(_at(_id(2)), [("log", LONG + "ahead")], "task-b")
    saver.copy_thread("t", "u")
    target = _saver(app)
    assert target.get_tuple(_at(_id(2), "u")) is None
    assert _ids(target.list({"configurable": {"thread_id": "u", "checkpoint_ns": ""}})) == [_id(1)]
    assert _writes(target, _at(_id(1), "u")) == [("task-a", "log", LONG)]
    saver.delete_thread("t")
    # a prune keeps the copied pending row (after the latest checkpoint: a writer's, in flight), the
    # copied checkpoint and its writes; once a later checkpoint is stored, the pending row goes
    target.prune(["u"])
    assert _pending(db_url) == [("acme", "u", _id(2))]
    assert _writes(_saver(app), _at(_id(1), "u")) == [("task-a", "log", LONG)]
    _put(target, _at(_id(1), "u"), 1, checkpoint_id=_id(3))
    target.prune(["u"])
    assert _pending(db_url) == []
    assert _ids(target.list({"configurable": {"thread_id": "u", "checkpoint_ns": ""}})) == [_id(3)]


@SQLITE
def test_delete_for_runs_keeps_the_other_runs_writes(app: cairn.App, db_url: str) -> None:
    saver = _saver(app)
    c1 = _put(saver, None, 0, run_id="r1", checkpoint_id=_id(1))
    saver.put_writes(c1, [("log", LONG + "1")], "task-1")
    c2 = _put(saver, c1, 1, run_id="r2", checkpoint_id=_id(2))
    saver.put_writes(c2, [("log", LONG + "2")], "task-2")
    saver.put_writes(_at(_id(3)), [("log", LONG + "3")], "task-3")  # pending
    saver.delete_for_runs(["r1"])
    reader = _saver(app)
    assert _ids(reader.list(THREAD)) == [_id(2)]
    assert _writes(reader, c2) == [("task-2", "log", LONG + "2")]
    # the pending row after the latest checkpoint is a writer's in flight: kept, its value too
    assert _pending(db_url) == [("acme", "t", _id(3))]
    assert _sql(db_url, "SELECT count(*) FROM lg_values")[0][0] == 2  # task-2's and task-3's
    saver.delete_for_runs(["r2"])  # no checkpoint left: nothing is after one, all goes
    assert _pending(db_url) == []
    assert _sql(db_url, "SELECT count(*) FROM lg_values")[0][0] == 0


@SQLITE
def test_prune_keeps_the_pending_rows_above_the_latest_only(app: cairn.App, db_url: str) -> None:
    """A pending row below the latest (a crash's leftover: its checkpoint
    never stored, the run resumed from before it) goes; one above (a writer
    in flight, its checkpoint's put to come) stays, and its value with it."""
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(10))
    saver.put_writes(_at(_id(15)), [("log", LONG + "orphan")], "task-x")
    c2 = _put(saver, c1, 1, checkpoint_id=_id(20))
    saver.put_writes(c2, [("log", LONG)], "task-a")
    saver.put_writes(_at(_id(30)), [("log", LONG + "ahead")], "task-y")
    _saver(app).prune(["t"])
    reader = _saver(app)
    assert _ids(reader.list(THREAD)) == [_id(20)]
    assert _writes(reader, c2) == [("task-a", "log", LONG)]
    assert _pending(db_url) == [("acme", "t", _id(30))]
    assert _sql(db_url, "SELECT count(*) FROM lg_values")[0][0] == 2  # task-a's and task-y's


@SQLITE
def test_a_damaged_pending_record_does_not_block_a_prune_or_a_delete(app: cairn.App, db_url: str) -> None:
    saver = _saver(app)
    c1 = _put(saver, None, 0, run_id="r1", checkpoint_id=_id(1))
    saver.put_writes(c1, [("log", LONG)], "task-a")
    for thread in ("t", "v"):
        if thread == "v":  # a thread of another run, which delete_for_runs deletes
            _put(saver, {"configurable": {"thread_id": "v", "checkpoint_ns": ""}}, 0, run_id="r9")
        saver.put_writes(_at(_id(2), thread), [("log", LONG + "ahead")], "task-b")
    _sql(db_url, "UPDATE lg_checkpoints SET writes = x'ff00ff00deadbeef' WHERE checkpoint_kind = ''")
    # above the latest checkpoint the pending row is kept, so its record is read for the values it
    # names: refused naming it, nothing deleted (as a stored checkpoint's damaged record)
    with pytest.raises(UnreadableCheckpoint, match=_id(2)):
        saver.prune(["t"])
    assert _writes(_saver(app), c1) == [("task-a", "log", LONG)]
    _put(saver, c1, 1, checkpoint_id=_id(3))  # below the latest now: a leftover, dropped unread
    saver.prune(["t"])
    saver.delete_for_runs(["r9"])
    assert _pending(db_url) == []
    assert _ids(_saver(app).list(THREAD)) == [_id(3)]


@SQLITE
def test_a_put_filling_a_damaged_pending_row_refuses_to_read_it(app: cairn.App, db_url: str) -> None:
    """The put keeps the pending row's writes as they are: a damaged record is
    then the stored checkpoint's, refused when read (not read as no writes)."""
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(1))
    saver.put_writes(_at(_id(2)), [("log", LONG)], "task-b")
    _sql(db_url, "UPDATE lg_checkpoints SET writes = x'ff00ff00deadbeef' WHERE checkpoint_kind = ''")
    _put(saver, c1, 1, checkpoint_id=_id(2))
    with pytest.raises(UnreadableCheckpoint) as refused:
        _saver(app).get_tuple(_at(_id(2)))
    assert "\n" not in str(refused.value).strip()


# -- concurrency --------------------------------------------------------------------------------


@SQLITE
def test_async_writes_and_put_of_one_checkpoint_race_without_loss(app: cairn.App, db_url: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(1))

    async def race(n: int) -> None:
        checkpoint = empty_checkpoint()
        checkpoint["id"] = _id(100 + n)
        checkpoint["channel_values"] = {"n": n}
        version = saver.get_next_version(f"{n:010d}", None)
        checkpoint["channel_versions"] = {"n": version}
        at = _at(_id(100 + n))
        await asyncio.gather(
            *(saver.aput_writes(at, [("log", f"{LONG}{n}-{k}")], f"task-{k}") for k in range(3)),
            saver.aput(c1, checkpoint, {"step": n}, {"n": version}),
            *(saver.aput_writes(at, [("log", f"{LONG}{n}-{k}")], f"task-{k}") for k in range(3, 6)),
        )

    for n in range(4):
        asyncio.run(race(n))
    assert _pending(db_url) == []
    reader = _saver(app)
    for n in range(4):
        assert sorted(_writes(reader, _at(_id(100 + n)))) == [
            (f"task-{k}", "log", f"{LONG}{n}-{k}") for k in range(6)
        ]


# -- a crash between a checkpoint's writes and its put ------------------------------------------


def _drive(db: str, ledger: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    return processes.run(
        "tests.langgraph.pending_crash_main", [db, "t", "6", str(ledger), str(kill_at)], timeout=120
    )


@SQLITE
@pytest.mark.slow
def test_a_process_killed_between_writes_and_their_put_resumes_to_the_same_state(
    app: cairn.App, db_url: str, tmp_path: Path
) -> None:
    """LangGraph's default durability ("async"): the driver is SIGKILLed in
    the put of a checkpoint whose writes are committed (its pending row), so
    the checkpoint itself is lost. A new process resumes: the state is an
    uninterrupted run's, each log item once, the killed step's node at most
    twice (its checkpoint was not durable), the others once; the pending row
    is never read, and a prune drops it."""
    ledger = tmp_path / "ledger"
    killed = _drive(db_url, ledger, 3)
    assert killed.returncode == -9, killed.stderr
    assert "killed with a pending row" in killed.stdout, killed.stdout
    left = [r[2] for r in _pending(db_url)]  # the killed put's, and those the loop ran ahead to
    assert left
    resumed = _drive(db_url, ledger, -1)
    assert resumed.returncode == 0, resumed.stderr
    saver = _saver(app)
    from tests.langgraph.graphs import counting_loop

    graph = counting_loop(6, "s").compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    assert graph.get_state(config).values == {"log": [f"s{n}" for n in range(6)]}
    history = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config)]
    assert not set(left) & set(history)
    assert all(saver.get_tuple(_at(p)) is None for p in left)
    runs = ledger.read_text().split()
    assert sorted(set(runs)) == [str(n) for n in range(6)]
    assert all(runs.count(str(n)) <= 2 for n in range(6)), runs
    saver.prune(["t"])
    assert _pending(db_url) == []
    assert graph.get_state(config).values == {"log": [f"s{n}" for n in range(6)]}


# -- a prune by another saver between a checkpoint's writes and its put ---------------------------


@pytest.mark.parametrize("maintenance", ["prune", "delete_for_runs"])
def test_a_prune_between_writes_and_their_put_leaves_the_checkpoint_readable(
    app: cairn.App, db_url: str, maintenance: str
) -> None:
    """Another process's maintenance (a prune, or deleting an older run)
    between a checkpoint's writes and its put keeps those writes and the
    values they name: the writer's saver takes them as stored."""
    from langgraph.checkpoint.base import empty_checkpoint

    writer = _saver(app)
    c0 = _put(writer, None, 0, run_id="r0", checkpoint_id=_id(1))
    c1 = _put(writer, c0, 1, run_id="r1", checkpoint_id=_id(2))
    writer.put_writes(_at(_id(3)), [("log", LONG)], "task")  # the node's write: a pending row
    if maintenance == "prune":
        _saver(app).prune(["t"])
    else:
        _saver(app).delete_for_runs(["r0"])
    checkpoint = empty_checkpoint()
    checkpoint["id"] = _id(3)
    checkpoint["channel_values"] = {"log": LONG}  # the value the node wrote, now the channel's
    version = writer.get_next_version(None, None)
    checkpoint["channel_versions"] = {"log": version}
    writer.put(c1, checkpoint, {"step": 2}, {"log": version})
    found = _saver(app).get_tuple(_at(_id(3)))
    assert found is not None
    assert found.checkpoint["channel_values"]["log"] == LONG


@SQLITE
def test_a_graph_pruned_by_another_saver_mid_run_stays_readable(app: cairn.App, db_url: str) -> None:
    """LangGraph's default durability: a node's message is a pending write,
    then the item its checkpoint's list appends (the value the saver encoded
    once). A prune of the thread by another saver in between (a periodic
    maintenance job) must not leave the thread's latest checkpoint unreadable."""
    from tests.langgraph.graphs import appending_loop

    saver = _saver(app)
    store: Any = saver._rows
    put = store.lg_put
    pruner = _saver(app)

    pruned: list[str] = []
    puts: list[str] = []

    def pruned_first(key: Any, holder: Any, row: Any, *args: Any, **kwargs: Any) -> Any:
        """Once, past the input's two puts: when the node's write to this checkpoint came
        first (the loop runs the node while its checkpoint's put waits), another process's
        maintenance prunes the thread."""
        import time

        puts.append(row.checkpoint_id)
        wait = 100 if len(puts) >= 3 and not pruned else 0
        pending = "SELECT 1 FROM lg_checkpoints WHERE checkpoint_id = ? AND checkpoint_kind = ''"
        for _ in range(wait):
            if _sql(db_url, pending, (row.checkpoint_id,)):
                pruner.prune(["t"])
                pruned.append(row.checkpoint_id)
                break
            time.sleep(0.005)
        return put(key, holder, row, *args, **kwargs)

    store.lg_put = pruned_first
    try:
        graph = appending_loop(4, lambda n: f"{LONG}{n}").compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "t"}}
        graph.invoke({"log": []}, config)
    finally:
        del store.lg_put
    assert pruned
    assert _saver(app).get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}) is not None
    assert graph.get_state(config).values == {"log": [f"{LONG}{n}" for n in range(4)]}


# -- rows of lg_writes from before beside a pending row ------------------------------------------


def _legacy_row(carrier: CairnSaver, db_url: str, checkpoint_id: str, task_id: str, value: int) -> None:
    """A write as a saver before pending rows stored it: a row of lg_writes (its value row put by
    ``carrier``'s put_writes to checkpoint 1, stored: the value is stored, that record not read)."""
    from cairn.store.checkpointsql import pack_refs

    carrier.put_writes(_at(_id(1)), [("n", value)], "carrier")
    _sql(
        db_url,
        "INSERT INTO lg_writes (tenant, thread_id, ns, checkpoint_id, task_id, idx, channel, "
        "task_path, kind, refs) VALUES ('acme', 't', '', ?, ?, 0, 'n', '', 'value', ?)",
        (checkpoint_id, task_id, pack_refs([carrier._digest(*carrier._dump(value))])),
    )


@SQLITE
def test_a_prune_drops_old_rows_of_a_checkpoint_that_is_only_pending(app: cairn.App, db_url: str) -> None:
    """Rows of lg_writes of a checkpoint not stored, beside its pending row (a
    thread upgraded mid-run): a pending row is no checkpoint, so both go once
    a later checkpoint is stored; until then both are a writer's in flight."""
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(1))
    _legacy_row(saver, db_url, _id(2), "task-old", 10**12)
    saver.put_writes(_at(_id(2)), [("log", LONG)], "task-new")
    saver.prune(["t"])
    assert _sql(db_url, "SELECT count(*) FROM lg_writes WHERE checkpoint_id = ?", (_id(2),))[0][0] == 1
    assert _pending(db_url) == [("acme", "t", _id(2))]
    _put(saver, c1, 1, checkpoint_id=_id(3))
    saver.prune(["t"])
    assert _sql(db_url, "SELECT count(*) FROM lg_writes")[0][0] == 0
    assert _pending(db_url) == []


@SQLITE
def test_old_rows_and_a_pending_row_of_one_checkpoint_read_as_one_list(app: cairn.App, db_url: str) -> None:
    """The old row is the earlier write: a task's regular write retried into
    the pending row keeps the old one, once; other tasks' writes are kept."""
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(1))
    _legacy_row(saver, db_url, _id(2), "task-a", 10**12)
    writer = _saver(app)
    writer.put_writes(_at(_id(2)), [("n", 10**13)], "task-a")  # task-a again: its first write stays
    writer.put_writes(_at(_id(2)), [("log", LONG)], "task-b")
    _put(writer, c1, 1, checkpoint_id=_id(2))
    expected = [("task-a", "n", 10**12), ("task-b", "log", LONG)]
    assert _writes(_saver(app), _at(_id(2))) == expected
    _put(_saver(app), _at(_id(2)), 2, checkpoint_id=_id(3))  # another saver takes the thread: it folds
    assert _writes(_saver(app), _at(_id(2))) == expected


# -- two databases handles racing on one thread --------------------------------------------------


@SQLITE
def test_a_writer_refused_mid_stream_wrote_exactly_its_accepted_writes(app: cairn.App, db_url: str) -> None:
    """A saver streams put_writes into a pending row while a saver of another
    App on the same file takes the thread: every write accepted before is
    there, none refused after is, and the taker's writes follow."""
    import threading

    first = _saver(app)
    _put(first, None, 0, checkpoint_id=_id(1))
    accepted: list[str] = []
    refused: list[str] = []
    started = threading.Event()

    def stream() -> None:  # until refused (the taker takes the thread once ten are in)
        for i in range(20_000):
            task = f"a{i:05d}"
            try:
                first.put_writes(_at(_id(2)), [("log", LONG + task)], task)
            except ThreadTaken:
                refused.append(task)
                return
            accepted.append(task)
            if i == 10:
                started.set()

    worker = threading.Thread(target=stream)
    worker.start()
    other = cairn.App(db=db_url, lease_seconds=5.0)
    try:
        assert started.wait(30)
        taker = _saver(other)
        taker.put_writes(_at(_id(2)), [("log", LONG + "taker")], "taker")
        worker.join(60)
        assert refused, "the stream was never refused"
        _put(taker, _at(_id(1)), 1, checkpoint_id=_id(2))
        found = _writes(_saver(other), _at(_id(2)))
    finally:
        other.close()
    assert sorted(t for t, _, _ in found) == sorted([*accepted, "taker"])
    assert all(v == LONG + t for t, _, v in found)


# -- encryption ----------------------------------------------------------------------------------


@SQLITE
def test_a_sealed_thread_with_a_pending_row_copies_rekeys_and_prunes(db_url: str) -> None:
    from cairn.api.keys import Keys
    from cairn.langgraph import CairnSaver
    from tests.encryption.test_sealed_store import build, keyring

    app = build(db_url, keyring())
    try:
        saver = CairnSaver(app, tenant="a")
        c1 = _put(saver, None, 0, checkpoint_id=_id(1))
        saver.put_writes(c1, [("log", LONG)], "task-a")
        saver.put_writes(_at(_id(2)), [("log", LONG + "pending")], "task-b")
        saver.copy_thread("t", "u")  # sealed: read and put again, the pending row not among them
        keys = Keys(app.store)
        keys.rotate()
        keys.reencrypt(page=2)
        assert all(not r.failures for r in keys.verify()), [r.failures for r in keys.verify()]
        reader = CairnSaver(app, tenant="a")
        assert _ids(reader.list({"configurable": {"thread_id": "u", "checkpoint_ns": ""}})) == [_id(1)]
        assert _writes(reader, _at(_id(1), "u")) == [("task-a", "log", LONG)]
        assert reader.get_tuple(_at(_id(2), "u")) is None
        assert [r[1:] for r in _pending(db_url)] == [("t", _id(2))]
        _put(saver, c1, 1, checkpoint_id=_id(2))
        assert _writes(CairnSaver(app, tenant="a"), _at(_id(2))) == [("task-b", "log", LONG + "pending")]
        CairnSaver(app, tenant="a").prune(["t", "u"])
        assert _writes(CairnSaver(app, tenant="a"), _at(_id(2))) == [("task-b", "log", LONG + "pending")]
        assert _writes(CairnSaver(app, tenant="a"), _at(_id(1), "u")) == [("task-a", "log", LONG)]
    finally:
        app.close()



@SQLITE
def test_copying_again_after_the_put_gives_the_target_the_stored_checkpoint(
    app: cairn.App, db_url: str
) -> None:
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(1))
    saver.put_writes(_at(_id(2)), [("log", LONG)], "task-b")
    saver.copy_thread("t", "u")  # while the checkpoint's writes are pending
    _put(saver, c1, 1, checkpoint_id=_id(2))
    saver.copy_thread("t", "u")  # again, once it is stored
    reader = _saver(app)
    assert _ids(reader.list({"configurable": {"thread_id": "u", "checkpoint_ns": ""}})) == [_id(2), _id(1)]
    assert _writes(reader, _at(_id(2), "u")) == [("task-b", "log", LONG)]


# -- real graphs: fan-out and an interrupt under the default durability ---------------------------


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    rounds: int


@SQLITE
def test_a_fan_out_and_an_interrupt_resume_from_the_filled_rows(app: cairn.App, db_url: str) -> None:
    """Five nodes in parallel each super-step (their writes appended to one
    pending row from the loop's threads); in round 1 one of them interrupts.
    The resumed run (another saver, as another process would) takes the four
    others' writes from the checkpoint's filled row: none of them runs again
    (the interrupted one does, from its start: LangGraph's rule), every item
    is there once, and no pending row is left once a run ended."""
    from collections import Counter

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt

    ran: Counter[tuple[str, int]] = Counter()

    def branch(name: str) -> Any:
        def node(state: State) -> dict[str, Any]:
            ran[(name, state["rounds"])] += 1
            if name == "b0" and state["rounds"] == 1:
                return {"log": [f"{LONG}{name}{state['rounds']} {interrupt('go on?')}"]}
            return {"log": [f"{LONG}{name}{state['rounds']}"]}

        return node

    def join(state: State) -> dict[str, Any]:
        return {"rounds": state["rounds"] + 1}

    def route(state: State) -> Any:
        return END if state["rounds"] >= 3 else [f"b{i}" for i in range(5)]

    def build() -> Any:
        g = StateGraph(State)
        for i in range(5):
            g.add_node(f"b{i}", branch(f"b{i}"))
            g.add_edge(f"b{i}", "join")
        g.add_node("join", join)
        g.add_conditional_edges(START, route)
        g.add_conditional_edges("join", route)
        return g

    config: Any = {"configurable": {"thread_id": "t"}}
    first = build().compile(checkpointer=_saver(app))
    first.invoke({"log": [], "rounds": 0}, config)
    assert first.get_state(config).next == ("b0",)
    assert _pending(db_url) == []
    second = build().compile(checkpointer=_saver(app))
    second.invoke(Command(resume="yes"), config)
    values = second.get_state(config).values
    expected = [f"{LONG}b{i}{r}" + (" yes" if (i, r) == (0, 1) else "") for r in range(3) for i in range(5)]
    assert sorted(values["log"]) == sorted(expected)
    assert values["rounds"] == 3
    assert ran == {(f"b{i}", r): 2 if (i, r) == (0, 1) else 1 for r in range(3) for i in range(5)}
    assert _pending(db_url) == []


@SQLITE
def test_a_pending_row_of_a_subgraph_namespace_alone_is_no_checkpoint(app: cairn.App, db_url: str) -> None:
    """A namespace whose only row is pending (a subgraph's first writes): it
    has no checkpoint, hides none of the root's, and a prune drops it."""
    saver = _saver(app)
    c1 = _put(saver, None, 0, checkpoint_id=_id(1))
    child = {"configurable": {"thread_id": "t", "checkpoint_ns": "child:1", "checkpoint_id": _id(9)}}
    saver.put_writes(child, [("log", LONG)], "task-c")
    reader = _saver(app)
    assert reader.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": "child:1"}}) is None
    assert reader.get_tuple(child) is None
    assert _ids(reader.list({"configurable": {"thread_id": "t", "checkpoint_ns": "child:1"}})) == []
    assert _ids(reader.list({"configurable": {"thread_id": "t"}})) == [_id(1)]
    reader.prune(["t"])
    assert _pending(db_url) == []
    assert _ids(_saver(app).list(THREAD)) == [_id(1)]
    assert _writes(_saver(app), c1) == []
