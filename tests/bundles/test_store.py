"""The store's part of bundles, on both backends: bundles stored once per id,
claims that take only the bundles a worker serves (and runs older than
bundles by their workflow), counts per bundle, and the migrate transition."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import cairn
from cairn.engine.bundles import Bundle
from cairn.errors import InvalidRunState, RunNotFound
from cairn.store.records import EventType, NewRun, Payload, RunStatus

V1 = Bundle.build("wf", "1", "ast:one", {"p": "A"}, {}, [])
V2 = Bundle.build("wf", "2", "ast:two", {"p": "A"}, {}, [])
OTHER = Bundle.build("other", "1", "ast:x", {}, {}, [])


@pytest.fixture
def store(db_url: str) -> Iterator[cairn.store.contract.Store]:
    app = cairn.App(db=db_url)
    yield app.store
    app.close()


def _run(run_id: str, bundle: Bundle | None, workflow: str = "wf") -> NewRun:
    version = bundle.version if bundle is not None else "1"
    return NewRun(run_id=run_id, workflow=workflow, workflow_version=version, tenant="t", thread_id=None,
                  input=Payload(data=b"{}"), bundle=None if bundle is None else bundle.bundle_id)


def test_bundles_are_stored_once_per_id_and_read_back_as_stored(store: cairn.store.contract.Store) -> None:
    store.put_bundles([V1.record(), V2.record(), OTHER.record()])
    store.put_bundles([V1.record()])
    assert sorted(b.bundle_id for b in store.bundles(["wf"])) == sorted([V1.bundle_id, V2.bundle_id])
    assert {b.bundle_id for b in store.bundles()} == {V1.bundle_id, V2.bundle_id, OTHER.bundle_id}
    [one] = [b for b in store.bundles(["wf"]) if b.bundle_id == V1.bundle_id]
    assert Bundle.from_record(one) == V1
    assert one.served_at is None
    store.serve_bundles([V1.bundle_id])
    [served] = [b for b in store.bundles(["wf"]) if b.bundle_id == V1.bundle_id]
    assert served.served_at is not None


def test_claims_take_only_served_bundles_and_unbundled_runs(store: cairn.store.contract.Store) -> None:
    store.put_bundles([V1.record(), V2.record()])
    for run in (_run("r1", V1), _run("r2", V2), _run("legacy", None)):
        store.create_run(run)
    claimed = store.claim_runs("w", ["wf"], 10, 30.0, 3, bundles=[V2.bundle_id])
    assert sorted(c.run.run_id for c in claimed) == ["legacy", "r2"]
    assert {c.run.run_id: c.run.bundle for c in claimed} == {"legacy": None, "r2": V2.bundle_id}
    assert store.claim_runs("w", ["wf"], 10, 30.0, 3, bundles=[]) == []  # r1: nobody serves it
    [r1] = store.claim_runs("w", ["wf"], 10, 30.0, 3)  # bundles=None: any bundle
    assert r1.run.run_id == "r1"
    counts = {(b, s): n for b, _, _, s, n in store.bundle_counts()}
    assert counts == {(V1.bundle_id, "running"): 1, (V2.bundle_id, "running"): 1, (None, "running"): 1}


def test_migrate_run_moves_the_bundle_and_records_it(store: cairn.store.contract.Store) -> None:
    store.put_bundles([V1.record(), V2.record(), OTHER.record()])
    store.create_run(_run("r", V1))
    moved = store.migrate_run("r", V2.record(), {"check": "compatible", "forced": False}, actor="cli:ada@h")
    assert (moved.bundle, moved.workflow_version, moved.status) == (V2.bundle_id, "2", RunStatus.PENDING)
    entry = store.history("r")[-1]
    assert entry.event is EventType.RUN_MIGRATED
    assert entry.detail == {"from_bundle": V1.bundle_id, "to_bundle": V2.bundle_id, "from_version": "1",
                            "to_version": "2", "check": "compatible", "forced": False, "actor": "cli:ada@h"}
    with pytest.raises(InvalidRunState, match="not of run 'r'"):
        store.migrate_run("r", OTHER.record(), {})
    with pytest.raises(RunNotFound):
        store.migrate_run("nope", V2.record(), {})
    [claim] = store.claim_runs("w", ["wf"], 1, 30.0, 3)
    with pytest.raises(InvalidRunState, match="is running"):
        store.migrate_run("r", V1.record(), {})
    assert store.get_run("r").bundle == V2.bundle_id  # type: ignore[union-attr]
    assert claim.run.bundle == V2.bundle_id


def test_an_incompatible_run_is_parked_until_retried_from_the_top(store: cairn.store.contract.Store) -> None:
    import time

    from cairn.store.records import HistoryEvent

    store.create_run(_run("r", None))
    [c] = store.claim_runs("w", ["wf"], 1, 30.0, 3)
    failed = HistoryEvent(run_id="r", seq=c.next_seq, event=EventType.STEP_FAILED, at=time.time(),
                          epoch=c.run.epoch, position=0, step_kind="step", name="s", attempt=1,
                          detail={"error": {"type": "X", "message": "x"}})
    store.append("r", c.run.epoch, [failed])
    parked = HistoryEvent(run_id="r", seq=c.next_seq + 1, event=EventType.RUN_INCOMPATIBLE, at=time.time(),
                          epoch=c.run.epoch,
                          detail={"type": "Order", "found_version": 1, "current_version": 2})
    store.suspend_run("r", c.run.epoch, parked, None, None, status=RunStatus.INCOMPATIBLE)
    assert store.get_run("r").status is RunStatus.INCOMPATIBLE  # type: ignore[union-attr]
    assert store.claim_runs("w", ["wf"], 1, 30.0, 3) == []  # never claimable by itself
    retried = store.retry_run("r", actor="cli:ada@h")
    assert retried.status is RunStatus.PENDING
    entry = store.history("r")[-1]
    assert entry.event is EventType.RUN_RETRIED
    assert entry.detail is not None
    assert entry.detail["from_position"] is None  # nothing recorded is void: the whole journal replays
    assert entry.detail["previous_status"] == "incompatible"
