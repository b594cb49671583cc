"""A hostile tenant's transactional step on PostgreSQL: the handle is the
tenant's own session, so row-level security applies to its SQL exactly as
to the store's, and it cannot read or write another tenant's runs or
journal, whatever it sends.

Uses the deployment of ``test_postgres_rls`` (an owner role that migrated
the schema, a role per tenant, their stores opened with ``tenant=``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cairn.errors import SQLError, TransactionMisuse
from cairn.store.records import HistoryEvent
from cairn.store.transactions import Tx
from tests.store.contract import claim, ev, new_run
from tests.store.test_postgres_rls import Deployment, deployment  # noqa: F401 - the fixture

FORGED = ("INSERT INTO history (run_id, seq, event, at, epoch, tenant) "
          "VALUES ('g1', 99, 'step.completed', 1.0, 1, %s)")

#: what a hostile body sends, and how it must end: an error (nothing commits), or rows it may see
ATTACKS: dict[str, tuple[list[tuple[str, tuple[str, ...] | None]], type[BaseException]]] = {
    "forge-entry-as-the-other-tenant": ([(FORGED, ("globex",))], SQLError),
    "forge-entry-under-own-tenant": ([(FORGED, ("acme",))], SQLError),  # the row's run must be its tenant's
    "delete-journal": ([("DELETE FROM history WHERE run_id = 'g1'", None)], SQLError),
    "rewrite-journal": ([("UPDATE history SET detail = 'x' WHERE run_id = 'g1'", None)], SQLError),
    "widen-the-tenant-then-forge": ([("SELECT set_config('cairn.tenant', 'globex', false)", None),
                                     (FORGED, ("globex",))], SQLError),
    "widen-the-tenant-locally-then-forge": ([("SELECT set_config('cairn.tenant', 'globex', true)", None),
                                             (FORGED, ("globex",))], SQLError),
    "set-role": ([("SET ROLE NONE", None)], TransactionMisuse),
}
#: statements that run but must find nothing of the other tenant
BLIND: list[tuple[str, tuple[str, ...] | None]] = [
    ("UPDATE runs SET status = 'cancelled' WHERE run_id = 'g1'", None),
    ("UPDATE runs SET epoch = epoch + 7 WHERE tenant = 'globex'", None),
]


def _setup(d: Deployment) -> tuple[int, int]:
    d.globex.create_run(new_run("g1", tenant="globex"))
    g = claim(d.globex, "g1")
    d.globex.append("g1", g.run.epoch, [ev(d.clock, "g1", g.next_seq, g.run.epoch)])
    d.acme.create_run(new_run("a1", tenant="acme"))
    a = claim(d.acme, "a1")
    return a.run.epoch, a.next_seq


def _body(d: Deployment, statements: Sequence[tuple[str, tuple[str, ...] | None]], seq: int, epoch: int,
          seen: list[object]) -> object:
    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
        for statement, params in statements:
            seen.append(tx.execute(statement, params).rowcount)
        seen.append(tx.execute("SELECT count(*) FROM runs WHERE run_id = 'g1'").scalar())
        seen.append(tx.execute("SELECT count(*) FROM history WHERE run_id = 'g1'").scalar())
        return [ev(d.clock, "a1", seq, epoch)], None

    return body


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_tenants_handle_cannot_touch_another_tenants_journal(
    deployment: Deployment, attack: str  # noqa: F811 - the fixture
) -> None:
    d = deployment
    epoch, seq = _setup(d)
    before = (d.owner.get_run("g1"), d.owner.history("g1"))
    statements, error = ATTACKS[attack]
    with pytest.raises(error):
        d.acme.transact("a1", epoch, _body(d, statements, seq, epoch, []))  # type: ignore[arg-type]
    assert (d.owner.get_run("g1"), d.owner.history("g1")) == before
    assert len(d.owner.history("a1")) == seq - 1  # its own record went with the attack
    # the session is intact afterwards: the tenant's next transaction sees its own run
    seen: list[object] = []
    d.acme.transact("a1", epoch, _body(d, [], seq, epoch, seen))  # type: ignore[arg-type]
    assert seen == [0, 0]
    assert d.owner.history("a1")[-1].seq == seq


def test_what_a_tenants_handle_may_run_finds_nothing_of_the_other(
    deployment: Deployment,  # noqa: F811 - the fixture
) -> None:
    d = deployment
    epoch, seq = _setup(d)
    before = (d.owner.get_run("g1"), d.owner.history("g1"))
    seen: list[object] = []
    d.acme.transact("a1", epoch, _body(d, BLIND, seq, epoch, seen))  # type: ignore[arg-type]
    assert seen == [0, 0, 0, 0]  # nothing updated; g1 is invisible: no run, no history
    assert (d.owner.get_run("g1"), d.owner.history("g1")) == before
    assert d.owner.history("a1")[-1].seq == seq  # its own record committed


def test_a_widened_tenant_setting_is_set_back(deployment: Deployment) -> None:  # noqa: F811 - the fixture
    """A body that sets ``cairn.tenant`` to another tenant for the session and
    returns: the store sets its own tenant again before the record (the
    session would otherwise keep the setting after the commit), so the
    record lands under the tenant's own run and the other's is untouched."""
    d = deployment
    epoch, seq = _setup(d)
    before = (d.owner.get_run("g1"), d.owner.history("g1"))
    seen: list[object] = []
    widen = [("SELECT set_config('cairn.tenant', 'globex', false)", None)]
    d.acme.transact("a1", epoch, _body(d, widen, seq, epoch, seen))  # type: ignore[arg-type]
    assert seen == [1, 0, 0]  # it saw nothing of globex's even so (a role of acme only)
    assert (d.owner.get_run("g1"), d.owner.history("g1")) == before
    assert d.owner.history("a1")[-1].seq == seq

    def look(tx: Tx) -> tuple[Sequence[HistoryEvent], object]:
        tenant = tx.execute("SELECT current_setting('cairn.tenant')").scalar()
        return [ev(d.clock, "a1", seq + 1, epoch)], tenant

    assert d.acme.transact("a1", epoch, look) == "acme"
