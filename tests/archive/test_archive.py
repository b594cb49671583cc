"""Archived runs (issue 26 item 5), on both backends, encryption off and on:
a closed run's rows leave the hot tables for one archive object and come
back bit for bit; while archived the run shows, exports, verifies and forks
as before and nothing may change it; an archive that is damaged, another
run's or another tenant's is refused naming the run; pruning an archived
run deletes its object."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.api.audit import Audit, Verdict
from cairn.errors import InvalidRunState, RunNotFound
from cairn.store.archive import ArchiveError, decode
from cairn.store.auditlinks import link_version
from cairn.store.auditverify import verify_store
from cairn.store.records import RunStatus
from tests.archive.test_archive_cli import moves
from tests.audit.test_chain import chain_rows, rewrite_in_version
from tests.encryption.test_sealed_store import Raw, build, drive, keyring
from tests.graph.test_travel import START_STATE, Agent

#: every table an archived run's rows live in, each read in full, keys first
TABLES = {
    "mailbox": "SELECT * FROM mailbox WHERE run_id = :r ORDER BY seq",
    "approvals": "SELECT * FROM approvals WHERE run_id = :r ORDER BY request_id",
    "memory_run": "SELECT * FROM memory_run WHERE run_id = :r ORDER BY key",
    "runs": "SELECT * FROM runs WHERE run_id = :r",
}
#: the history as it reads (SQLite: a spilled payload put back) with the audit columns
HISTORY = {
    "sqlite": "SELECT e.*, h.tenant, h.digest, h.link FROM history_entries AS e JOIN history AS h "
              "USING (run_id, seq) WHERE run_id = :r ORDER BY seq",
    "postgres": "SELECT * FROM history WHERE run_id = :r ORDER BY seq",
}


def rows_of(place: str, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    raw = Raw(place)
    found = {name: raw(query, r=run_id) for name, query in TABLES.items()}
    found["history"] = raw(HISTORY["sqlite" if place.startswith("sqlite") else "postgres"], r=run_id)
    return found


def graph_app(place: str, sealed: bool) -> tuple[cairn.App, Agent]:
    app = cairn.App(db=place, keyring=keyring() if sealed else None, lease_seconds=5.0)
    return app, Agent(app)


def test_a_run_linked_before_version_2_archives_and_restores(place: str) -> None:
    """A run whose links are all of version 1 (written before version 2, issue
    26, 2026-12-07), and one whose links are all of version 2 (written before
    version 3, chain26), archive with their links marked as archives did
    before and come back with the same links; a run holding versions 1 and 3
    (as written now) comes back with each."""
    app = build(place, None)
    old = app.start("canary", "linked before", tenant="a").run_id
    assert drive(app, old, "ok") == "completed"
    old2 = app.start("canary", "linked before version 3", tenant="a").run_id
    assert drive(app, old2, "ok") == "completed"
    mixed = app.start("canary", "linked since", tenant="a").run_id
    assert drive(app, mixed, "ok") == "completed"
    raw = Raw(place)
    rewrite_in_version(raw, old, 1)
    rewrite_in_version(raw, old2, 2)
    for run_id, versions in ((old, {1}), (old2, {2}), (mixed, {1, 3})):
        links = [row[16] for row in chain_rows(raw, run_id)]
        assert {link_version(link) for link in links} == versions
        record = app.operator.archive_run(run_id)
        stored, _ = _object(place, app, record.ref)
        assert [bytes(e[16]) for e in decode(stored, record.tenant, run_id).history] == links
        assert verify_store(app.store).problems == []  # verified while archived
        app.operator.restore(run_id)
        assert [row[16] for row in chain_rows(raw, run_id)] == links
    assert verify_store(app.store).problems == []
    app.close()


def test_a_round_trip_is_bit_exact_for_every_row_of_the_run(place: str, sealed: bool) -> None:
    """A canary run (steps, an artifact payload, memory, an event, a signal,
    an approval with an edit and a comment) and a graph run (model calls,
    a write tool's operation, checkpoints, run memory)."""
    app = build(place, keyring() if sealed else None)
    canary = app.start("canary", "round trip " + "q" * 3000, tenant="a").run_id  # a spilled/offloaded input
    assert drive(app, canary, "ok") == "completed"
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="g")
    for run_id in (canary, "g"):
        before = rows_of(place, run_id)
        assert all(before[t] for t in ("history", "memory_run", "runs")), "nothing to archive: proves nothing"
        history = app.store.history(run_id)
        record = app.operator.archive_run(run_id)
        assert record.entries == len(before["history"])
        assert record.actor == app.operator.actor
        during = rows_of(place, run_id)
        assert {t: len(r) for t, r in during.items()} == {"mailbox": 0, "approvals": 0, "memory_run": 0,
                                                          "runs": 1, "history": 0}
        assert during["runs"] == before["runs"]
        assert app.store.history(run_id) == history  # read from the archive
        stored, _ = _object(place, app, record.ref)
        if sealed:  # sealed whole: without the tenant's key nothing of it (names, times, sizes) reads
            with pytest.raises(ArchiveError, match="sealed and encryption is off"):
                decode(stored, record.tenant, run_id)
        else:
            assert len(decode(stored, record.tenant, run_id).history) == record.entries
        back = app.operator.restore(run_id)
        assert (back.restored_by, back.actor) == (app.operator.actor, app.operator.actor)
        assert moves(app, run_id) == [("archive.move", app.operator.actor, "in-process"),
                                      ("archive.restore", app.operator.actor, "in-process")]
        assert rows_of(place, run_id) == before
        assert app.store.run_archive(run_id) is None
    assert before["approvals"] or rows_of(place, canary)["approvals"]
    assert verify_store(app.store).problems == []
    app.close()


def test_an_archived_run_shows_exports_verifies_and_forks(place: str, sealed: bool) -> None:
    app, agent = graph_app(place, sealed)
    app.run(agent.workflow, START_STATE, run_id="o")
    seen = (app.history("o"), app.store.history_headers("o"), app.store.history_index("o"),
            app.store.model_calls("o"), app.store.run_usage("o"), app.export_run("o"),
            [c.step for c in app.checkpoints("o")], app.graph_state("o", 2))
    assert seen[3], "no model call recorded: the test would prove nothing"
    app.operator.archive_run("o")
    assert rows_of(place, "o")["history"] == []
    assert (app.history("o"), app.store.history_headers("o"), app.store.history_index("o"),
            app.store.model_calls("o"), app.store.run_usage("o"), app.export_run("o"),
            [c.step for c in app.checkpoints("o")], app.graph_state("o", 2)) == seen
    assert app.get_run("o").status.value == "completed"
    chains = verify_store(app.store, run_id="o")
    assert chains.problems == []
    assert chains.entries == len(seen[0])
    assert "o" in chains.heads
    app.graph_fork("o", 2, update={"n": 41}, run_id="f")
    assert app.resume("f")["messages"][-1] == "done n=41"
    assert agent.calls["act"] == 1  # the fork read the archived checkpoint: act is not run again
    app.close()


def test_an_archived_run_cannot_be_changed_and_only_a_closed_run_is_archived(place: str) -> None:
    app = build(place, None)
    failed = app.start("canary", "f", tenant="a").run_id
    assert drive(app, failed, "fail") == "failed"
    open_run = app.start("canary", "open", tenant="a").run_id
    with pytest.raises(InvalidRunState, match="only a closed run is archived"):
        app.operator.archive_run(open_run)
    with pytest.raises(RunNotFound):
        app.operator.archive_run("no-such-run")
    app.operator.archive_run(failed)
    with pytest.raises(InvalidRunState, match="archived already"):
        app.operator.archive_run(failed)
    before = rows_of(place, failed)
    raw = Raw(place)
    for change in (
        lambda: app.operator.retry(failed),
        lambda: app.operator.set_budget(failed, cairn.Budget(tool_calls=3)),
        # behind the store's back: the database itself refuses a change of the run row
        lambda: raw("UPDATE runs SET status = 'pending' WHERE run_id = :r", r=failed),
    ):
        with pytest.raises(Exception, match="archived"):
            change()
    assert rows_of(place, failed) == before
    app.operator.restore(failed)
    with pytest.raises(InvalidRunState, match="is not archived"):
        app.operator.restore(failed)
    app.operator.retry(failed)  # hot again: changes are allowed again
    app.close()


def test_a_run_changed_while_being_archived_stays_hot_and_whole(place: str) -> None:
    """The run is retried between the read of its rows and the move: the
    move sees a run that is no longer closed and changes nothing."""
    app = build(place, None)
    run_id = app.start("canary", "racing", tenant="a").run_id
    assert drive(app, run_id, "fail") == "failed"
    store: Any = app.store
    put = store.put_artifact

    def put_then_retry(data: bytes) -> str:
        ref = put(data)
        app.operator.retry(run_id)
        return ref

    store.put_artifact = put_then_retry
    before_move = rows_of(place, run_id)
    with pytest.raises(InvalidRunState, match="only a closed run"):
        store.archive_run(run_id)
    del store.put_artifact
    after = rows_of(place, run_id)
    assert after["history"][:-1] == before_move["history"]
    assert store.run_archive(run_id) is None
    assert after["history"][-1][2] == "run.retried"  # the retry's entry, and nothing of the run deleted
    app.close()


def test_a_row_added_while_being_archived_keeps_the_run_hot(place: str) -> None:
    """A closed run that gains a row between the read and the move (any
    writer: here one behind the store's back) is not archived without it."""
    app = build(place, None)
    run_id = app.start("canary", "racing", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    store: Any = app.store
    put = store.put_artifact

    def put_then_write(data: bytes) -> str:
        ref = put(data)
        Raw(place)("INSERT INTO memory_run (run_id, key, tenant, version, created_at, updated_at) "
                   "VALUES (:r, 'late', 'a', 1, 0, 0)", r=run_id)
        return ref

    store.put_artifact = put_then_write
    with pytest.raises(InvalidRunState, match="changed while it was being archived"):
        store.archive_run(run_id)
    del store.put_artifact
    assert store.run_archive(run_id) is None
    assert ("late",) in Raw(place)("SELECT key FROM memory_run WHERE run_id = :r", r=run_id)
    app.close()


def _object(place: str, app: cairn.App, ref: str) -> tuple[bytes, Any]:
    """The stored bytes of artifact ``ref`` and a function that overwrites them (behind the store's back)."""
    if place.startswith("sqlite"):
        path = Path(place.removeprefix("sqlite:///") + ".artifacts") / ref[:2] / ref
        return path.read_bytes(), path.write_bytes
    raw = Raw(place)
    data = bytes(raw("SELECT data FROM artifacts WHERE ref = :r", r=ref)[0][0])
    return data, lambda new: raw("UPDATE artifacts SET data = :c WHERE ref = :r", c=new, r=ref)


def _stored(place: str, ref: str) -> bool:
    if place.startswith("sqlite"):
        return (Path(place.removeprefix("sqlite:///") + ".artifacts") / ref[:2] / ref).exists()
    return bool(Raw(place)("SELECT 1 FROM artifacts WHERE ref = :r", r=ref))


def test_a_damaged_or_swapped_archive_is_refused_naming_the_run(place: str, sealed: bool) -> None:
    app = build(place, keyring() if sealed else None)
    one, two = (app.start("canary", f"x{i}", tenant="a").run_id for i in range(2))
    theirs = app.start("canary", "x", tenant="b").run_id
    for run_id in (one, two, theirs):
        drive(app, run_id, "ok")
    first, second = app.operator.archive_run(one), app.operator.archive_run(two)
    raw = Raw(place)
    # another tenant's archive under this run's record: its body (or its seal) names tenant a's run
    third = app.operator.archive_run(theirs)
    raw("UPDATE run_archives SET ref = :ref WHERE run_id = :r", ref=first.ref, r=theirs)
    with pytest.raises(ArchiveError, match=f"archive of run '{theirs}' is refused"):
        app.history(theirs)
    raw("UPDATE run_archives SET ref = :ref WHERE run_id = :r", ref=third.ref, r=theirs)
    # another run's archive under this run's record
    raw("UPDATE run_archives SET ref = :ref WHERE run_id = :r", ref=second.ref, r=one)
    app.store._archive_cache().clear()  # a fresh process: nothing decoded yet
    swapped = f"archive of run '{one}' is refused: (it is the archive of run '{two}'|its seal does not open)"
    with pytest.raises(ArchiveError, match=swapped) as caught:
        app.history(one)
    assert caught.value.run_id == one
    with pytest.raises(ArchiveError, match=one):
        app.operator.restore(one)
    raw("UPDATE run_archives SET ref = :ref WHERE run_id = :r", ref=first.ref, r=one)
    # one byte flipped in the object
    data, write = _object(place, app, first.ref)
    write(data[:-7] + bytes([data[-7] ^ 1]) + data[-6:])
    app.store._archive_cache().clear()  # a fresh process: nothing decoded yet
    with pytest.raises(ArchiveError, match=f"archive of run '{one}'"):
        app.history(one)
    # the verifier says TAMPERED naming the run, and goes on with the others
    chains = verify_store(app.store)
    assert [(p.run_id, "its archive cannot be read" in p.what) for p in chains.problems] == [(one, True)]
    assert two in chains.heads
    assert one not in chains.heads
    report = Audit(app.store).verify()
    assert report.verdict is Verdict.TAMPERED
    # the record's head edited: the object no longer matches what was archived
    write(data)
    raw("UPDATE run_archives SET last_seq = last_seq - 1 WHERE run_id = :r", r=one)
    app.store._archive_cache().clear()  # a fresh process: nothing decoded yet
    with pytest.raises(ArchiveError, match="not the ones recorded"):
        app.history(one)
    assert len(app.history(two)) == second.entries  # the other run reads on
    app.close()


def test_pruning_an_archived_run_deletes_its_archive_object(place: str) -> None:
    app = build(place, None)
    run_id = app.start("canary", "gone", tenant="a").run_id
    drive(app, run_id, "ok")
    record = app.operator.archive_run(run_id)
    refs = {r[0] for r in Raw(place)("SELECT ref FROM run_archive_refs WHERE run_id = :r", r=run_id)}
    assert refs, "the canary's large step result is an artifact: the archive must keep it"
    store: Any = app.store
    now = store.clock()
    store.clock = lambda: now + 10 * 86400  # past the artifacts' grace
    # a collection pass while archived: the referenced refs leave the queue (pruning must queue them again)
    assert store.prune_runs(now + 9 * 86400, [RunStatus.KILLED], limit=10) == 0
    assert all(_stored(place, ref) for ref in {record.ref} | refs)
    assert store.prune_runs(now + 1, limit=10) == 1
    for ref in {record.ref} | refs:
        assert not _stored(place, ref)
    assert Raw(place)("SELECT count(*) FROM run_archives")[0][0] == 0
    assert Raw(place)("SELECT count(*) FROM run_archive_refs")[0][0] == 0
    app.close()


def test_collection_keeps_what_an_archived_run_references(place: str) -> None:
    app = build(place, None)
    run_id = app.start("canary", "kept", tenant="a").run_id
    drive(app, run_id, "ok")
    exported = app.export_run(run_id)  # reads the artifact the large step result is stored in
    record = app.operator.archive_run(run_id)
    refs = {r[0] for r in Raw(place)("SELECT ref FROM run_archive_refs WHERE run_id = :r", r=run_id)}
    store: Any = app.store
    now = store.clock()
    store.clock = lambda: now + 10 * 86400
    # a cutoff after everything, for a status no run has: no run goes, the whole queue is collected
    assert store.prune_runs(now + 9 * 86400, [RunStatus.KILLED], limit=10) == 0
    for ref in {record.ref} | refs:
        assert _stored(place, ref)
    store.clock = lambda: now
    assert app.export_run(run_id) == exported
    app.close()
