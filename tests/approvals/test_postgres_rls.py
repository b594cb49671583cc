"""Row-level security for approvals: a role scoped to one tenant neither
lists, reads, decides nor forges another tenant's approval requests, through
the store or in raw SQL (the deployment of ``tests/store/test_postgres_rls``)."""

from __future__ import annotations

import psycopg
import pytest

from cairn.errors import RunNotFound
from cairn.store.records import ApprovalRequest, ApprovalStatus, Payload, approval_key
from tests.store.contract import ev
from tests.store.test_postgres_rls import Deployment, deployment, running

__all__ = ["deployment"]  # the fixture, imported so pytest finds it here


def _request(d: Deployment, run_id: str = "a1") -> str:
    c = running(d.acme, d.clock, run_id)
    event = ev(d.clock, run_id, c.next_seq, c.run.epoch, step_kind="approval", name="refund",
               payload=Payload(data=b'{"details":{"cents":5000}}'))
    d.acme.request_approval(run_id, c.run.epoch, event,
                            ApprovalRequest("req", "refund", "Refund", {"type": "object"}, None, None))
    return "req"


def test_a_tenant_role_cannot_list_or_decide_another_tenants_approvals(deployment: Deployment) -> None:
    d = deployment
    request_id = _request(d)
    assert d.globex.approvals() == []
    assert d.globex.approvals(tenant="acme", pending=False) == []
    assert d.globex.approvals(run_id="a1", pending=False) == []
    for status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EDITED):
        with pytest.raises(RunNotFound):  # indistinguishable from a missing run
            d.globex.decide_approval("a1", request_id, status, Payload(data=b"{}"), None, actor="cli:eve@x")
    assert d.acme.deliveries("a1") == []
    (still,) = d.acme.approvals()
    assert still.status is ApprovalStatus.PENDING
    # the owner of the tenant may
    decided = d.acme.decide_approval("a1", request_id, ApprovalStatus.APPROVED, Payload(data=b"{}"), "ok",
                                     actor="cli:ada@x")
    assert decided.decided_by == "cli:ada@x"
    assert [m.key for m in d.acme.deliveries("a1")] == [approval_key(request_id)]


def test_raw_sql_as_another_tenant_sees_and_changes_nothing(deployment: Deployment) -> None:
    d = deployment
    _request(d)
    assert d.as_role("globex", "SELECT count(*) FROM approvals") == [(0,)]
    assert d.as_role("globex", "UPDATE approvals SET status = 'approved', decided_by = 'eve'") == [(0,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):  # not granted
        d.as_role("globex", "DELETE FROM approvals")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):  # WITH CHECK
        d.as_role("globex", "INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, "
                            "action, type_name, requested_at) "
                            "VALUES ('a1', 'forged', 'acme', 9, 9, 'x', 'x', 0)")
    # nor under acme's run stamped with its own tenant (a request an exempt worker would list and decide)
    for run_id in ("a1", "no-such-run"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            d.as_role("globex", "INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, "
                                "action, type_name, requested_at) "
                                f"VALUES ('{run_id}', 'forged', 'globex', 9, 9, 'x', 'x', 0)")
    assert len(d.owner.approvals(pending=False)) == 1
    (row,) = d.acme.approvals()
    assert (row.status, row.decided_by) == (ApprovalStatus.PENDING, None)
    assert d.as_role("acme", "SELECT count(*) FROM approvals") == [(1,)]
