"""Every read of an archived run's rows answers from its archive (issue 26
item 5), on both backends, encryption off and on: the mailbox
(``deliveries``, ``delivery``), approvals (``approvals`` of the run),
run memory (``run_memory``), and the workspace collector's roots (an
archived run's snapshots stay reachable: their objects are not collected).
Each answer is the one given while the run was hot, never an empty one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cairn.api.wscollect import collect
from cairn.store.contract import Store
from cairn.store.records import EventType, Payload, RunStatus
from cairn.workspace import TreeCache, snapshot
from tests.archive.test_archive import rows_of
from tests.encryption.test_sealed_store import build, drive, keyring
from tests.store.contract.helpers import FakeClock, ev
from tests.workspace.test_collect import HOUR, Run, restores, stored


def reads(store: Store, run_id: str) -> dict[str, Any]:
    """Every store read of the run's mailbox, approvals and run memory."""
    (approval,) = store.approvals(run_id=run_id, pending=False)
    (memory,) = store.run_memory(run_id)
    return {
        "deliveries": store.deliveries(run_id),
        "deliveries of go": store.deliveries(run_id, "go"),
        "deliveries after 1": store.deliveries(run_id, None, 1),
        "delivery at": [store.delivery(run_id, d.key, d.seq) for d in store.deliveries(run_id)],
        "next delivery": store.delivery(run_id, "go"),
        "approvals": store.approvals(run_id=run_id, pending=False),
        "approval": store.approvals(run_id=run_id, request_id=approval.request_id, pending=False),
        "approvals of its tenant": store.approvals(run_id=run_id, tenant="a", pending=False),
        "approvals of another tenant": store.approvals(run_id=run_id, tenant="b", pending=False),
        "pending": store.approvals(run_id=run_id),
        "run memory": store.run_memory(run_id),
        "run memory key": store.run_memory(run_id, memory.key),
        "run memory of its tenant": store.run_memory(run_id, tenant="a"),
        "run memory of another tenant": store.run_memory(run_id, tenant="b"),
    }


def test_mailbox_approval_and_run_memory_reads_answer_from_the_archive(place: str, sealed: bool) -> None:
    app = build(place, keyring() if sealed else None)
    run_id = app.start("canary", "reads", tenant="a").run_id
    assert drive(app, run_id, "ok") == "completed"
    hot = reads(app.store, run_id)
    viewed = app.operator.approvals(tenant="a", run_id=run_id, pending=False)
    assert len(hot["deliveries"]) >= 2, "the signal and the decision: the test would prove nothing"
    assert hot["approvals"][0].comment
    assert hot["approvals"][0].decision is not None
    assert hot["run memory"]
    assert hot["approvals of its tenant"]
    app.operator.archive_run(run_id)
    assert rows_of(place, run_id)["mailbox"] == []  # the hot tables hold nothing of it
    assert reads(app.store, run_id) == hot
    assert app.operator.approvals(tenant="a", run_id=run_id, pending=False) == viewed
    app.close()


def test_an_archived_runs_workspace_snapshots_are_not_collected(place: str, sealed: bool,
                                                               tmp_path: Path) -> None:
    app = build(place, keyring() if sealed else None)
    store, clock = app.store, _clock(app)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.bin").write_bytes(os.urandom(3000))
    run = Run(store, clock, "r1")
    root = snapshot(ws, TreeCache(), run.sink).root
    run.record(root)
    store.finish_run("r1", run.epoch, ev(clock, "r1", run.seq, run.epoch, EventType.RUN_COMPLETED),
                     RunStatus.COMPLETED, Payload(data=b'"ok"'), None)
    app.operator.archive_run("r1")
    before = stored(store)
    clock.advance(2 * HOUR)
    (done,) = collect(store, "default")
    assert (done.roots, done.deleted) == (1, 0)
    assert stored(store) == before
    app.operator.restore("r1")
    assert restores(store, root, tmp_path / "check")
    app.close()


def _clock(app: Any) -> FakeClock:
    clock = app.store.clock = FakeClock(app.store.clock())
    return clock
