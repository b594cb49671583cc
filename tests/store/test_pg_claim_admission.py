"""Queue admission holds against a tenant's own SQL role (issue 21).

A tenant given its own PostgreSQL role (row-level security, migration 0006)
may change its own runs with any SQL. Admission (queue and tenant
concurrency, a tenant's share, the token-bucket rates) used to be enforced
only by the claim statements Cairn's store runs, so that role could:

- fake claims: move its runs to ``running`` by UPDATE or INSERT (or move
  running runs into a limited queue, or between two tenants it holds),
  past every concurrency limit and without spending a token, filling a
  shared queue so that other tenants' runs could not start;
- drain the queue-wide bucket (every tenant's rate) through the spending
  functions, which charged again on every call and counted any running row
  the transaction had merely touched.

Migration 0027 admits every run a tenant's role moves to ``running`` when
its transaction commits (``admit_claim``): the limits are checked under the
claim locks, and the tokens are charged there, by the database, once per
run. These tests are the attacks, and the legitimate paths beside them.

Uses the deployment of ``tests/store/test_postgres_rls.py``: an owner role
that migrated the schema, and one scoped login role per tenant.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cairn import App, Context
from cairn.store.admission import QueueLimits, QueueShare, Rate
from cairn.store.postgres import PostgresStore
from tests.store.contract import WF, FakeClock, claim, finish, new_run
from tests.store.test_postgres_rls import SCHEMA, Deployment, deployment  # noqa: F401

#: What a fake claim writes: the columns a real claim sets (lease far away).
TAKE = "status = 'running', owner = 'evil', epoch = epoch + 1, lease_expires_at = 1e12, runnable_at = 1e12"
INSERT_RUNNING = ("INSERT INTO runs (run_id, tenant, workflow, workflow_version, queue, status, epoch, "
                  "owner, lease_expires_at, runnable_at, created_at, updated_at) "
                  "VALUES ('{id}', 'acme', 'wf', '1', '{queue}', 'running', 1, 'evil', 1e12, 1e12, 0, 0)")


def _raw(d: Deployment, key: str, *statements: str, tenant: str | None = "") -> bool:
    """Run ``statements`` as the role of ``key`` in one transaction (its own
    tenant setting, or ``tenant`` when given, ``None``: none); whether it
    committed."""
    with psycopg.connect(d.urls[key]) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        if tenant is not None:
            conn.execute("SELECT set_config('cairn.tenant', %s, false)", (tenant or key,))
        conn.commit()
        try:
            for statement in statements:
                conn.execute(statement)
            conn.commit()
        except psycopg.Error:
            conn.rollback()
            return False
    return True


def _running(d: Deployment, queue: str, tenant: str | None = None) -> int:
    """Runs of ``queue`` (and ``tenant``) running, as the owner counts them."""
    query = ("SELECT count(*) FROM runs "
             "WHERE status = 'running' AND queue = %s AND tenant = COALESCE(%s, tenant)")
    [(count,)] = d.as_role("owner", query, (queue, tenant))
    return int(count)


def _tokens(d: Deployment, queue: str, tenant: str) -> float | None:
    """A bucket's stored tokens (``None``: no row, a full bucket)."""
    query = "SELECT tokens FROM queue_buckets WHERE queue = %s AND tenant = %s"
    rows = d.as_role("owner", query, (queue, tenant))
    return rows[0][0] if rows else None


def _share_tokens(d: Deployment, queue: str, tenant: str) -> float | None:
    query = "SELECT tokens FROM queue_shares WHERE queue = %s AND tenant = %s"
    rows = d.as_role("owner", query, (queue, tenant))
    return rows[0][0] if rows else None


def _pending(d: Deployment, tenant: str, queue: str, count: int, prefix: str = "") -> list[str]:
    store = d.acme if tenant == "acme" else d.globex
    ids = [f"{prefix or tenant}-{queue}{i}" for i in range(count)]
    for run_id in ids:
        store.create_run(new_run(run_id, tenant=tenant, queue=queue))
    return ids


# -- fake claims past the concurrency limits -----------------------------------------------------

#: Ways a tenant's role moves its runs to running without a claim (each a
#: list of transactions; a refused one changes nothing). ``{free}``: acme's
#: runs running in the unlimited queue "free".
FAKE_CLAIMS: dict[str, Callable[[list[str], list[str]], list[list[str]]]] = {
    "update all": lambda pending, free: [[
        f"UPDATE runs SET {TAKE} WHERE queue = 'q' AND status = 'pending'"]],
    "update one by one": lambda pending, free: [
        [f"UPDATE runs SET {TAKE} WHERE run_id = '{r}'"] for r in pending],
    "insert running": lambda pending, free: [
        [INSERT_RUNNING.format(id=f"evil{i}", queue="q")] for i in range(4)],
    "upsert": lambda pending, free: [[
        "INSERT INTO runs AS r (run_id, tenant, workflow, workflow_version, queue, status, created_at, "
        "updated_at) "
        "SELECT run_id, 'acme', 'wf', '1', 'q', 'pending', 0, 0 FROM runs WHERE queue = 'q' "
        "ON CONFLICT (run_id) DO UPDATE SET status = 'running', owner = 'evil', epoch = r.epoch + 1, "
        "lease_expires_at = 1e12, runnable_at = 1e12"]],
    "move running runs into the queue": lambda pending, free: [
        [f"UPDATE runs SET queue = 'q' WHERE run_id = '{r}'"] for r in free],
    "revive finished runs": lambda pending, free: [[
        f"UPDATE runs SET {TAKE}, queue = 'q' WHERE status = 'completed'"]],
    "checked at once": lambda pending, free: [[
        "SET CONSTRAINTS ALL IMMEDIATE", f"UPDATE runs SET {TAKE} WHERE queue = 'q' AND status = 'pending'"]],
    "checks deferred": lambda pending, free: [[
        "SET CONSTRAINTS ALL DEFERRED", f"UPDATE runs SET {TAKE} WHERE queue = 'q' AND status = 'pending'"]],
    "row security off": lambda pending, free: [[
        "SET LOCAL row_security = off", f"UPDATE runs SET {TAKE} WHERE queue = 'q' AND status = 'pending'"]],
    "enter and leave": lambda pending, free: [[
        f"UPDATE runs SET {TAKE} WHERE run_id = '{r}'",
        f"UPDATE runs SET status = 'pending' WHERE run_id = '{r}'",
        f"UPDATE runs SET {TAKE} WHERE run_id = '{r}'"] for r in pending],
}


def _acme_holds(d: Deployment) -> tuple[list[str], list[str]]:
    """acme's runs: four pending in q, three running in the unlimited queue
    "free", three completed; globex has two pending in q."""
    pending = _pending(d, "acme", "q", 4)
    free = _pending(d, "acme", "free", 3)
    assert len(d.acme.claim_runs("aw", [WF], 3, 30.0, 3, queues=["free"])) == 3
    for run_id in _pending(d, "acme", "done", 3):
        finish(d.acme, d.clock, claim(d.acme, run_id))
    _pending(d, "globex", "q", 2)
    return pending, free


@pytest.mark.parametrize("attack", sorted(FAKE_CLAIMS))
def test_a_fake_claim_cannot_pass_the_queues_concurrency_limits(deployment: Deployment, attack: str) -> None:  # noqa: F811
    """Queue q admits 3 runs at once, 2 per tenant. acme's role moves its
    runs to running by SQL of its own: whatever it does, q never runs more
    than that, and globex still gets the slot that is its due."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", concurrency=3, tenant_concurrency=2))
    pending, free = _acme_holds(d)
    for transaction in FAKE_CLAIMS[attack](pending, free):
        _raw(d, "acme", *transaction)
    assert _running(d, "q", "acme") <= 2
    assert _running(d, "q") <= 3
    assert len(d.globex.claim_runs("gw", [WF], 5, 30.0, 3)) >= 1
    assert _running(d, "q") <= 3


@pytest.mark.parametrize("attack", sorted(FAKE_CLAIMS))
def test_a_fake_claim_cannot_pass_the_tenants_own_share(deployment: Deployment, attack: str) -> None:  # noqa: F811
    """acme's own share of q (one run at once, set for acme by the owner)
    binds acme's role, whatever SQL it runs; q itself has no limits."""
    d = deployment
    d.owner.set_queue_share(QueueShare("q", "acme", 1))
    pending, free = _acme_holds(d)
    for transaction in FAKE_CLAIMS[attack](pending, free):
        _raw(d, "acme", *transaction)
    assert _running(d, "q", "acme") <= 1


def test_a_role_of_two_tenants_cannot_move_running_runs_between_them(deployment: Deployment) -> None:  # noqa: F811
    """A role granted two tenants moves running runs from one to the other:
    the per-tenant limit of the tenant they land in holds."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", tenant_concurrency=1))
    role = conninfo_to_dict(d.urls["acme"])["user"]
    d.as_role("owner", "SELECT grant_tenant(%s, 'acme2')", (role,))
    for i in range(3):
        d.acme.create_run(new_run(f"a{i}", tenant="acme", queue="q"))
    assert len(d.acme.claim_runs("aw", [WF], 5, 30.0, 3)) == 1  # one at a time in q, for acme
    acme2 = PostgresStore(d.urls["acme"], schema=SCHEMA, clock=d.clock, tenant="acme2")
    try:
        for i in range(2):
            acme2.create_run(new_run(f"b{i}", tenant="acme2", queue="free"))
        assert len(acme2.claim_runs("bw", [WF], 5, 30.0, 3)) == 2
    finally:
        acme2.close()
    # both tenants in view (no setting): its running runs of acme2 become acme's, or move into q
    _raw(d, "acme", "UPDATE runs SET tenant = 'acme', queue = 'q' WHERE tenant = 'acme2'", tenant=None)
    _raw(d, "acme", "UPDATE runs SET tenant = 'acme' WHERE tenant = 'acme2'", tenant=None)
    _raw(d, "acme", "UPDATE runs SET queue = 'q' WHERE tenant = 'acme2'", tenant=None)
    _raw(d, "acme", "UPDATE runs SET tenant = 'acme2', queue = 'q' WHERE status = 'pending'", tenant=None)
    assert _running(d, "q", "acme") <= 1
    assert _running(d, "q", "acme2") <= 1


def test_a_refused_fake_claim_says_why_in_one_line_and_writes_nothing(deployment: Deployment) -> None:  # noqa: F811
    """The refusal comes at the commit, names the run and the limit, is a
    serialization failure (a store claim that lost a race plans again), and
    leaves every row as it was."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", concurrency=3, tenant_concurrency=2))
    pending, _ = _acme_holds(d)
    with psycopg.connect(d.urls["acme"]) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        conn.execute("SELECT set_config('cairn.tenant', 'acme', false)")
        assert conn.execute(f"UPDATE runs SET {TAKE} WHERE queue = 'q' AND status = 'pending'").rowcount == 4
        with pytest.raises(psycopg.errors.SerializationFailure) as info:
            conn.commit()
    primary = info.value.diag.message_primary or ""
    assert re.fullmatch(r"run acme-q[0-3] cannot start now: queue q runs at most 3 at once", primary)
    assert _running(d, "q") == 0
    assert all(d.owner.get_run(r).status.value == "pending" for r in pending)  # type: ignore[union-attr]


def test_two_tenants_taking_the_last_slot_at_once_cannot_both_have_it(deployment: Deployment) -> None:  # noqa: F811
    """q runs one run at once. acme's and globex's roles each move a run to
    running, and commit at the same time: the check of the second waits for
    the first's commit (it takes the queue's row, as a claim does) and then
    counts it, so one of the two is refused."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", concurrency=1))
    [a] = _pending(d, "acme", "q", 1)
    [g] = _pending(d, "globex", "q", 1)
    first = psycopg.connect(d.urls["acme"])
    try:
        first.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        first.execute("SELECT set_config('cairn.tenant', 'acme', false)")
        first.execute(f"UPDATE runs SET {TAKE} WHERE run_id = '{a}'")
        first.execute("SET CONSTRAINTS ALL IMMEDIATE")  # acme's check runs now: its transaction holds q
        outcome: list[bool] = []
        second = threading.Thread(target=lambda: outcome.append(_raw(d, "globex", f"UPDATE runs SET {TAKE} "
                                                                                  f"WHERE run_id = '{g}'")))
        second.start()
        _wait_for(lambda: bool(outcome) or _waiting_for_a_lock(d, "globex"))
        first.commit()
    finally:
        first.close()
    second.join(timeout=60)
    assert outcome == [False]
    assert _running(d, "q") == 1


class _Racing(FakeClock):
    """acme's store's clock that, read for the second time (a claim reads it
    once to find candidates, then again holding the queue's lock, after the
    running counts), first lets ``race`` commit: the counts the claim plans
    with are then stale."""

    def __init__(self, start: float, race: Callable[[], object]) -> None:
        super().__init__(start)
        self.reads = 0
        self.race = race

    def __call__(self) -> float:
        self.reads += 1
        if self.reads == 2:
            self.race()
        return self.now


def test_a_claim_that_lost_a_race_to_the_owners_inline_start_is_planned_again(
    deployment: Deployment,  # noqa: F811
) -> None:
    """q runs one run at once. acme's worker plans a claim of its run; the
    owner starts a run inline in q meanwhile (it takes no claim lock). The
    commit's check finds q over its limit and refuses as a serialization
    failure, so the store plans the claim again and takes nothing: no error,
    and q runs only the owner's run."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", concurrency=1))
    [a] = _pending(d, "acme", "q", 1)
    clock = _Racing(d.clock.now, lambda: d.owner.create_claimed_run(
        new_run("o1", tenant="globex", queue="q"), "inline", 30.0))
    racing = PostgresStore(d.urls["acme"], schema=SCHEMA, clock=clock, tenant="acme")
    try:
        assert racing.claim_runs("aw", [WF], 5, 30.0, 3) == []
    finally:
        racing.close()
    assert clock.reads > 2  # planned again
    assert _running(d, "q") == 1
    record = d.owner.get_run(a)
    assert record is not None
    assert record.status.value == "pending"


def _waiting_for_a_lock(d: Deployment, key: str) -> bool:
    """Whether a session of ``key``'s role waits for a lock (as the test
    server's superuser: other roles' wait events are hidden from the owner)."""
    role = conninfo_to_dict(d.urls[key])["user"]
    with psycopg.connect(d.admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s "
                           "AND wait_event_type = 'Lock'", (role,)).fetchone()
    return bool(row and row[0])


def test_a_claim_that_quarantines_a_damaged_run_spends_only_for_the_run_it_started(
    deployment: Deployment,  # noqa: F811
) -> None:
    """A tenant's worker claims two runs of a rated queue; one's own row is
    damaged, so the claim quarantines it in the same transaction. Only the
    run that went on running spent a token: the check at the commit reads
    each row as it is then."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", tenant_rate=Rate(5, 3600)))
    good, bad = _pending(d, "acme", "q", 2)
    d.as_role("owner", "UPDATE runs SET budget = '{nope' WHERE run_id = %s", (bad,))
    claims = d.acme.claim_runs("aw", [WF], 5, 30.0, 3)
    assert [c.run.run_id for c in claims] == [good]
    record = d.owner.get_run(bad)
    assert record is not None
    assert record.status.value == "quarantined"
    assert _tokens(d, "q", "acme") == 4


# -- fake claims past the rates -----------------------------------------------------------------


def _cycle(run_id: str) -> list[list[str]]:
    """Claim a run by SQL, then give it back: each round is one more claim."""
    return [[f"UPDATE runs SET {TAKE}, updated_at = 1e12 WHERE run_id = '{run_id}'"],
            [f"UPDATE runs SET status = 'pending', owner = NULL, runnable_at = 0 WHERE run_id = '{run_id}'"]]


@pytest.mark.parametrize("rate", ["queue", "tenant", "share"])
def test_fake_claims_spend_the_rates_tokens_and_stop_when_they_run_out(
    deployment: Deployment, rate: str  # noqa: F811
) -> None:
    """Three claims an hour (the queue-wide rate, the installation's
    per-tenant rate, or acme's own share's rate). acme's role claims and
    gives back one run six times over, by SQL: three rounds are admitted,
    each spending a token, and then none, so the rate holds for acme's
    fake claims as for its worker's."""
    d = deployment
    d.clock.now = time.time()  # a claim's clock is capped by the server's: keep them together
    if rate == "queue":
        d.owner.set_queue(QueueLimits("q", rate=Rate(3, 3600)))
    elif rate == "tenant":
        d.owner.set_queue(QueueLimits("q", tenant_rate=Rate(3, 3600)))
    else:
        d.owner.set_queue_share(QueueShare("q", "acme", rate=Rate(3, 3600)))
    [run_id] = _pending(d, "acme", "q", 1)
    claimed = 0
    for _ in range(6):
        take, give_back = _cycle(run_id)
        if _raw(d, "acme", *take):
            claimed += 1
            assert _raw(d, "acme", *give_back)
    assert claimed == 3
    assert d.acme.claim_runs("aw", [WF], 5, 30.0, 3) == []  # its worker finds the bucket empty too
    if rate == "share":
        stored = _share_tokens(d, "q", "acme")
    else:
        stored = _tokens(d, "q", "" if rate == "queue" else "acme")
    assert stored is not None
    assert 0 <= stored < 0.5


# -- draining the shared bucket through the spending functions ---------------------------------

SPEND = [
    "SELECT spend_queue_tokens(ARRAY['q'], ARRAY[1000]::bigint[], 1e12)",
    "SELECT spend_tenant_tokens(ARRAY['q'], ARRAY['acme'], ARRAY[1000]::bigint[], 1e12)",
    "SELECT spend_share_tokens(ARRAY['q'], ARRAY['acme'], ARRAY[1000]::bigint[], 1e12)",
]


def test_the_spending_functions_cannot_drain_a_bucket(deployment: Deployment) -> None:  # noqa: F811
    """Ten claims an hour in q (queue-wide, per tenant and acme's share).
    acme's worker claims two runs (8 tokens left in each bucket). Then acme's
    role calls every spending function again and again: after touching its
    running runs (which used to count as claimed by the transaction), and
    in a transaction that really claims one run. Only that one claim is
    charged: 7 tokens left, and globex's three runs all start."""
    d = deployment
    d.clock.now = time.time()
    d.owner.set_queue(QueueLimits("q", rate=Rate(10, 3600), tenant_rate=Rate(10, 3600)))
    d.owner.set_queue_share(QueueShare("q", "acme", rate=Rate(10, 3600)))
    pending = _pending(d, "acme", "q", 3)
    assert len(d.acme.claim_runs("aw", [WF], 2, 30.0, 3)) == 2
    _pending(d, "globex", "q", 3)
    touch = "UPDATE runs SET updated_at = updated_at WHERE status = 'running'"
    _raw(d, "acme", touch, *SPEND * 5)
    _raw(d, "acme", *SPEND * 5)
    assert _raw(d, "acme", f"UPDATE runs SET {TAKE} WHERE run_id = '{pending[2]}'", *SPEND * 5)
    for stored in (_tokens(d, "q", ""), _tokens(d, "q", "acme"), _share_tokens(d, "q", "acme")):
        assert stored is not None
        assert 7 <= stored < 7.5
    assert len(d.globex.claim_runs("gw", [WF], 5, 30.0, 3)) == 3


# -- the inline start (create_claimed_run, App.run) --------------------------------------------


def test_a_tenants_inline_start_is_admitted_like_a_claim(deployment: Deployment) -> None:  # noqa: F811
    """A tenant's role starting a run inline (``create_claimed_run``, what
    ``App.run`` does) cannot be told from a fake claim by the database, so
    it is admitted like one: on a full queue the run is created pending,
    ``claim_run`` takes it once a slot frees, and each start spends a token.
    The owner's inline starts are not held back (the installation's own)."""
    d = deployment
    d.clock.now = time.time()
    d.owner.set_queue(QueueLimits("q", concurrency=1, tenant_rate=Rate(5, 3600)))
    [g] = _pending(d, "globex", "q", 1)
    held = claim(d.globex, g)
    assert d.acme.create_claimed_run(new_run("a1", tenant="acme", queue="q"), "inline", 30.0) is None
    record = d.owner.get_run("a1")
    assert record is not None
    assert record.status.value == "pending"
    assert d.acme.claim_run("a1", "inline", 30.0, 3) is None
    assert _running(d, "q") == 1
    finish(d.globex, d.clock, held)
    got = d.acme.claim_run("a1", "inline", 30.0, 3)
    assert got is not None
    assert _tokens(d, "q", "acme") == 4  # its start spent a token of acme's rate
    finish(d.acme, d.clock, got)
    started = d.acme.create_claimed_run(new_run("a2", tenant="acme", queue="q"), "inline", 30.0)
    assert started is not None
    assert _tokens(d, "q", "acme") == 3
    # the owner's: never held back, and spending nothing
    assert d.owner.create_claimed_run(new_run("o1", tenant="acme", queue="q"), "inline", 30.0) is not None
    assert _running(d, "q") == 2
    assert _tokens(d, "q", "acme") == 3


def test_app_run_of_a_tenants_role_waits_for_its_queue(deployment: Deployment) -> None:  # noqa: F811
    """``App.run`` on a tenant's role whose queue ("default", one run at a
    time) is full: the run waits, pending, and runs here once the slot frees."""
    d = deployment
    d.owner.set_queue(QueueLimits("default", concurrency=1))
    [g] = _pending(d, "globex", "default", 1)
    held = claim(d.globex, g)
    app = App(store=PostgresStore(d.urls["acme"], schema=SCHEMA, tenant="acme"))
    results: list[Any] = []
    try:
        @app.workflow
        def double(ctx: Context, x: int) -> int:
            return 2 * x

        runner = threading.Thread(
            target=lambda: results.append(app.run(double, 21, run_id="a1", tenant="acme")))
        runner.start()
        _wait_for(lambda: d.owner.get_run("a1") is not None)
        record = d.owner.get_run("a1")
        assert record is not None
        assert record.status.value == "pending"  # not running while globex's run holds the slot
        finish(d.globex, d.clock, held)
        runner.join(timeout=120)
        assert not runner.is_alive()
    finally:
        app.close()
    assert results == [42]


def _wait_for(condition: Callable[[], bool], attempts: int = 6000) -> None:
    """Until ``condition`` holds (a progress condition; the bound only ends a hung test)."""
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the condition never held")
