"""Signals and events across tenants on PostgreSQL, where each tenant is a
database role under row-level security (the deployment of
``tests/store/test_postgres_rls.py``): a hostile tenant can neither signal,
nor read the events or mailbox of, another tenant's run, by the API or by
SQL of its own; what it is told is what an unknown run would tell it."""

from __future__ import annotations

import pytest

import cairn
from cairn.engine.executor import execute
from cairn.store.records import RunStatus
from tests.store.test_postgres_rls import Deployment, deployment  # noqa: F401  (the fixture)


def _apps(deployment: Deployment) -> tuple[cairn.App, cairn.App]:  # noqa: F811  (the fixture's name)
    return cairn.App(store=deployment.acme), cairn.App(store=deployment.globex)


def test_a_hostile_tenant_cannot_signal_or_read_another_tenants_run(deployment: Deployment) -> None:  # noqa: F811
    acme, globex = _apps(deployment)

    @acme.workflow(name="victim")
    def victim(ctx: cairn.Context) -> str:
        ctx.set_event("secret", "acme-s3cr3t")
        return str(ctx.wait_for_signal("go"))

    @globex.workflow(name="attacker")
    def attacker(ctx: cairn.Context, target: str) -> list[str]:
        told = []
        try:
            ctx.signal(target, "go", "pwned")
        except cairn.SignalRefused as refused:
            told.append(str(refused))
        try:
            ctx.get_event(target, "secret")
        except cairn.RunNotFound as missing:
            told.append(str(missing))
        return told

    victim_id = acme.start(victim, tenant="acme").run_id
    claim = deployment.acme.claim_run(victim_id, "w-acme", 5.0, 5)
    assert claim is not None
    assert execute(acme.runtime, claim, "w-acme").status == "suspended"

    # the API, as globex: exactly what an unknown run says
    with pytest.raises(cairn.RunNotFound, match=f"no run with id {victim_id!r}"):
        globex.signal(victim_id, "go", "pwned")
    with pytest.raises(cairn.RunNotFound, match=f"no run with id {victim_id!r}"):
        globex.get_event(victim_id, "secret")
    attack = globex.start(attacker, victim_id, tenant="globex").run_id
    claim = deployment.globex.claim_run(attack, "w-globex", 5.0, 5)
    assert claim is not None
    assert execute(globex.runtime, claim, "w-globex").status == "completed"
    assert globex.handle(attack).result(timeout=5) == [f"no run with id {victim_id!r}"] * 2

    # its own SQL: the mailbox and the victim's events are invisible, and a
    # message forged into the victim's mailbox is refused by the policy
    assert deployment.as_role("globex", "SELECT count(*) FROM mailbox") == [(0,)]
    assert deployment.as_role("globex", "SELECT count(*) FROM history WHERE step_kind = 'event'") == [(0,)]
    with pytest.raises(Exception, match=r"row-level security|violates"):
        deployment.as_role("globex", "INSERT INTO mailbox (run_id, seq, tenant, key, sent_at) "
                                      "VALUES (%s, 99, 'acme', 'signal:go', 0)", (victim_id,))
    assert acme.operator.mailbox(victim_id) == []
    assert acme.get_run(victim_id).status is RunStatus.SUSPENDED

    # its owner tenant still signals it
    acme.signal(victim_id, "go", "legit")
    claim = deployment.acme.claim_run(victim_id, "w-acme", 5.0, 5)
    assert claim is not None
    assert execute(acme.runtime, claim, "w-acme").status == "completed"
    assert acme.handle(victim_id).result(timeout=5) == "legit"
