"""Cross-run listings include the archived runs (issue 26 item 5): the
decided approvals of every run (``approvals(pending=False)`` without a run,
what ``cairn approvals --all``, ``GET /api/approvals?pending=false`` and the
MCP ``list_approvals(all=True)`` read) answer the same while some of the runs
are archived, in the same order and limit, on both backends, encryption off
and on; a tenant's listing never shows another tenant's archived run."""

from __future__ import annotations

from typing import Any

from tests.archive.test_archive import rows_of
from tests.encryption.test_sealed_store import build, drive, keyring


def listings(app: Any) -> dict[str, Any]:
    """Every cross-run listing of decided approvals, through the store and the operator."""
    store = app.store
    first = store.approvals(pending=False)[0].request_id
    return {
        "all": store.approvals(pending=False),
        "tenant a": store.approvals(tenant="a", pending=False),
        "tenant b": store.approvals(tenant="b", pending=False),
        "tenant c (none)": store.approvals(tenant="c", pending=False),
        "first two": store.approvals(pending=False, limit=2),
        "tenant a, first one": store.approvals(tenant="a", pending=False, limit=1),
        "one request id": store.approvals(request_id=first, pending=False),
        "pending (none: the runs are closed)": store.approvals(),
        "operator view of a": app.operator.approvals(tenant="a", pending=False),
    }


def test_cross_run_approval_listings_include_archived_runs(place: str, sealed: bool) -> None:
    app = build(place, keyring() if sealed else None)
    runs = [app.start("canary", f"listing {i}", tenant=tenant).run_id
            for i, tenant in enumerate(("a", "b", "a", "b"))]
    for run_id in runs:
        assert drive(app, run_id, "ok") == "completed"
    hot = listings(app)
    assert len(hot["all"]) == 4, "the test would prove nothing"
    assert len(hot["first two"]) == 2
    assert {a.run_id for a in hot["tenant a"]} == {runs[0], runs[2]}
    assert all(a.decision is not None for a in hot["all"])

    for run_id in (runs[0], runs[1]):  # the oldest request of each tenant
        app.operator.archive_run(run_id)
        assert rows_of(place, run_id)["approvals"] == []  # the hot table holds nothing of it
    assert listings(app) == hot
    assert {a.run_id for a in app.store.approvals(tenant="b", pending=False)} == {runs[1], runs[3]}

    app.operator.archive_run(runs[2])
    app.operator.archive_run(runs[3])  # every run archived: the listings read only archives
    assert listings(app) == hot
    assert listings(app) == hot  # again: each archive's approvals kept once read

    app.operator.restore(runs[0])  # hot again: listed once, from the table, not from what was kept
    assert listings(app) == hot
    app.operator.archive_run(runs[0])
    assert listings(app) == hot
    app.close()
