"""Row-level security: a PostgreSQL role scoped to one tenant.

The deployment these tests build is the one documented in
``cairn.store.postgres`` and migration 0004: a non-superuser *owner* role
migrates its own schema (so it owns the tables and is exempt from the
policies), and two login roles, one per tenant, get the documented grants.
Their stores are opened with ``tenant=...``. Superusers bypass row-level
security, so nothing here runs Cairn as the test server's superuser.

Roles are global to the server, so their names carry the process id and a
random tag (other test sessions may share the server), and every test drops
what it created.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cairn import App, Budget, Context
from cairn.cli.main import main
from cairn.engine.bundles import Bundle
from cairn.engine.schedules import tick_run_id
from cairn.errors import InvalidRunState, LeaseLost, PayloadError, RunNotFound, StoreError
from cairn.store import retention
from cairn.store.admission import QueueLimits, QueueShare, Rate
from cairn.store.checkpointsql import BlobRow, CheckpointRow, Holder, ThreadKey, ValueRow, WriteRow, pack_refs
from cairn.store.erasuresql import ErasureRecord
from cairn.store.memrecords import ItemPut, MemoryScope, Provenance, RunPut, ThreadAppend
from cairn.store.namespaces import encode_namespace
from cairn.store.oplog import OperatorAction
from cairn.store.postgres import PostgresStore
from cairn.store.records import ApprovalRequest, Claim, EventType, Payload, RunFilter, RunStatus, TokenRecord
from cairn.store.schedules import Fired, ScheduleSpec
from cairn.store.sqlfiles import load_migrations
from tests import pgvector_cluster
from tests.backends import libpq_url
from tests.pgvector_cluster import PgvectorBackend
from tests.store.contract import WF, FakeClock, claim, ev, finish, new_run

SCHEMA = "tenancy"
#: How the owner grants a role a tenant (the module doc of cairn.store.postgres).
GRANT = "SELECT {schema}.grant_tenant(%s, %s)"


def running(store: PostgresStore, clock: FakeClock, run_id: str) -> Claim:
    """A run of the store's own tenant, created and claimed through it."""
    assert store.tenant is not None
    store.create_run(new_run(run_id, tenant=store.tenant))
    return claim(store, run_id)


def _admin(url: str, *statements: sql.Composable | str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _rows(url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        return conn.execute(query, params).fetchall()


@dataclass
class Deployment:
    """An owner store and one store per tenant, on one fresh database."""

    admin_url: str
    urls: dict[str, str]  # role key ("owner", "acme", "globex") -> libpq URL logging in as that role
    clock: FakeClock
    owner: PostgresStore
    acme: PostgresStore
    globex: PostgresStore

    def as_role(self, key: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run SQL directly as a role, bypassing the store (as a bug would)."""
        with psycopg.connect(self.urls[key], autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
            if key != "owner":
                conn.execute("SELECT set_config('cairn.tenant', %s, false)", (key,))
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else [(cur.rowcount,)]


@pytest.fixture
def deployment(pg_url: str) -> Iterator[Deployment]:
    with deploy(pg_url) as built:
        yield built


@pytest.fixture(scope="session")
def pgvector_url() -> Iterator[str]:
    """The pgvector cluster (``tests/pgvector_cluster.py``), stopped at session end."""
    try:
        yield pgvector_cluster.require()
    finally:
        pgvector_cluster.shutdown()


@pytest.fixture(params=["postgres", "pgvector"])
def vector_deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """The deployment, and one on the pgvector cluster where an administrator
    created the extension in ``public`` first (the owner, no superuser,
    could not): the store must find it there and use it for every role."""
    if request.param == "postgres":
        with deploy(request.getfixturevalue("pg_url")) as built:
            yield built
        return
    database = PgvectorBackend(request.getfixturevalue("pgvector_url"), prefix="cairn_rlsvec")
    try:
        url = libpq_url(database.admin_url, database.name_in_server)
        _admin(url, "CREATE EXTENSION vector SCHEMA public")
        with deploy(url) as built:
            assert [s.pgvector for s in (built.owner, built.acme, built.globex)] == [True] * 3
            yield built
    finally:
        database.drop()


@contextlib.contextmanager
def deploy(pg_url: str) -> Iterator[Deployment]:
    """The owner and two tenant roles on the database of ``pg_url``, dropped after."""
    tag = f"cairn_rls_{os.getpid()}_{secrets.token_hex(3)}"
    roles = {key: f"{tag}_{key}" for key in ("owner", "acme", "globex")}
    dbname = conninfo_to_dict(pg_url)["dbname"]
    ident = {key: sql.Identifier(name) for key, name in roles.items()}
    _admin(pg_url, *[sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(i) for i in ident.values()],
           sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(str(dbname)), ident["owner"]))
    urls = {key: make_conninfo(pg_url, user=name) for key, name in roles.items()}
    stores: list[PostgresStore] = []
    try:
        clock = FakeClock()
        owner = PostgresStore(urls["owner"], schema=SCHEMA, clock=clock)  # migrates: it owns the tables
        stores.append(owner)
        with psycopg.connect(urls["owner"], autocommit=True) as conn:
            for key in ("acme", "globex"):
                conn.execute(sql.SQL(GRANT).format(schema=sql.Identifier(SCHEMA)), (roles[key], key))
        acme = PostgresStore(urls["acme"], schema=SCHEMA, clock=clock, tenant="acme")
        stores.append(acme)
        globex = PostgresStore(urls["globex"], schema=SCHEMA, clock=clock, tenant="globex")
        stores.append(globex)
        yield Deployment(pg_url, urls, clock, owner, acme, globex)
    finally:
        for store in stores:
            store.close()
        # DROP OWNED drops the owner's schema and revokes every grant (the
        # database-level one included), after which the roles can go.
        names = sql.SQL(", ").join(ident.values())
        _admin(pg_url, sql.SQL("DROP OWNED BY {}").format(names), sql.SQL("DROP ROLE {}").format(names))


def test_the_policies_are_enabled_and_the_owner_is_exempt(deployment: Deployment) -> None:
    rows = _rows(
        deployment.admin_url,
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, pg_get_userbyid(c.relowner) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname IN ('runs', 'history') ORDER BY c.relname",
        (SCHEMA,),
    )
    owner = conninfo_to_dict(deployment.urls["owner"])["user"]
    assert rows == [("history", True, False, owner), ("runs", True, False, owner)]
    super_user = _rows(deployment.urls["owner"], "SELECT rolsuper, rolbypassrls FROM pg_roles "
                       "WHERE rolname = current_user")
    assert super_user == [(False, False)]  # exempt as the owner, not as a superuser


def test_another_tenants_runs_are_invisible(deployment: Deployment) -> None:
    d = deployment
    a = running(d.acme, d.clock, "a1")
    d.acme.append("a1", a.run.epoch, [ev(d.clock, "a1", a.next_seq, a.run.epoch)])
    d.acme.create_run(new_run("a2", tenant="acme"))  # pending: claimable, by acme only
    d.globex.create_run(new_run("g1", tenant="globex"))

    assert d.globex.get_run("a1") is None
    assert d.globex.get_run("a2") is None
    assert d.globex.history("a1") == []
    assert [r.run_id for r in d.globex.list_runs(RunFilter())] == ["g1"]
    assert d.globex.list_runs(RunFilter(tenant="acme")) == []
    claimed = d.globex.claim_runs("gw", [WF], 10, 30.0, 3)
    assert [c.run.run_id for c in claimed] == ["g1"]
    assert d.globex.claim_run("a2", "gw", 30.0, 3) is None
    with pytest.raises(RunNotFound):
        d.globex.cancel_run("a2", "not yours")
    assert d.globex.kill_runs("not yours", tenant="acme") == []
    assert d.globex.renew_leases("w1", {"a1": a.run.epoch}, 30.0) == {"a1"}

    assert {r.run_id for r in d.acme.list_runs(RunFilter())} == {"a1", "a2"}
    record = d.acme.get_run("a2")
    assert record is not None
    assert (record.status, record.epoch) == (RunStatus.PENDING, 0)
    assert [c.run.run_id for c in d.acme.claim_runs("aw", [WF], 10, 30.0, 3)] == ["a2"]


def test_run_counts_of_a_tenant_role_hold_only_its_runs(deployment: Deployment) -> None:
    """The metrics' runs by status (``run_counts``), read as a tenant's role:
    another tenant's runs are not counted, not even as zeros."""
    d = deployment
    d.acme.create_run(new_run("a1", tenant="acme"))
    d.acme.create_run(new_run("a2", tenant="acme"))
    d.globex.create_run(new_run("g1", tenant="globex"))
    assert d.acme.run_counts() == [("acme", WF, "pending", 2)]
    assert d.globex.run_counts() == [("globex", WF, "pending", 1)]
    assert sorted(d.owner.run_counts()) == [("acme", WF, "pending", 2), ("globex", WF, "pending", 1)]


def test_writes_to_another_tenants_run_are_refused(deployment: Deployment) -> None:
    d = deployment
    a = running(d.acme, d.clock, "a1")
    before = d.owner.history("a1")
    with pytest.raises(LeaseLost):  # for globex the run does not exist, so it holds no lease on it
        d.globex.append("a1", a.run.epoch, [ev(d.clock, "a1", a.next_seq, a.run.epoch)])
    done = ev(d.clock, "a1", a.next_seq, a.run.epoch, EventType.RUN_COMPLETED)
    with pytest.raises(LeaseLost):
        d.globex.finish_run("a1", a.run.epoch, done, RunStatus.COMPLETED, Payload(data=b"1"), None)
    assert d.owner.history("a1") == before
    record = d.owner.get_run("a1")
    assert record is not None
    assert record.status is RunStatus.RUNNING
    # The same write, bypassing the store: the row is invisible, nothing changes.
    assert d.as_role("globex", "UPDATE runs SET status = 'failed' WHERE run_id = 'a1'") == [(0,)]
    assert d.as_role("globex", "SELECT count(*) FROM history WHERE run_id = 'a1'") == [(0,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
        d.as_role("globex", "DELETE FROM history WHERE run_id = 'a1'")  # no DELETE grant at all
    assert d.owner.history("a1") == before


def test_rows_for_another_tenant_are_refused_by_the_policy(deployment: Deployment) -> None:
    d = deployment
    with pytest.raises(StoreError, match="row-level security") as info:
        d.globex.create_run(new_run("sneaky", tenant="acme"))
    message = str(info.value)
    assert "'globex'" in message
    assert "\n" not in message
    assert d.owner.get_run("sneaky") is None
    with pytest.raises(StoreError, match="row-level security"):
        d.globex.create_claimed_run(new_run("sneaky", tenant="acme"), "gw", 30.0)
    assert d.owner.get_run("sneaky") is None

    # A child of another tenant: the parent's journal entry is rolled back too.
    p = running(d.globex, d.clock, "g1")
    event = ev(d.clock, "g1", p.next_seq, p.run.epoch)
    with pytest.raises(StoreError, match="row-level security"):
        d.globex.start_child("g1", p.run.epoch, event, new_run("g1.kid", tenant="acme"))
    assert len(d.owner.history("g1")) == p.next_seq - 1
    assert d.owner.get_run("g1.kid") is None

    # Raw SQL as the role, as a bug outside the store would write it.
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        d.as_role("globex", "INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, "
                  "created_at, updated_at) VALUES ('raw', 'acme', 'wf', '1', 'pending', 0, 0)")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        d.as_role("globex", "INSERT INTO history (run_id, seq, event, at, epoch, tenant) "
                  "VALUES ('g1', 1000, 'step.completed', 0, 1, 'acme')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        d.as_role("globex", "UPDATE runs SET tenant = 'acme' WHERE run_id = 'g1'")
    assert [r.tenant for r in d.owner.list_runs(RunFilter())] == ["globex"]


def test_a_scoped_store_runs_a_whole_life(deployment: Deployment) -> None:
    """Everything a worker does, under the policies: claims, appends,
    children, waits, finishes, operator actions, artifacts."""
    d = deployment
    ref = d.acme.put_artifact(b"x" * 100_000)
    d.acme.create_run(new_run("a1", tenant="acme", input=Payload(ref=ref)))
    c = claim(d.acme, "a1")
    e, s = c.run.epoch, c.next_seq
    d.acme.append("a1", e, [ev(d.clock, "a1", s, e), ev(d.clock, "a1", s + 1, e, position=1)])
    d.acme.start_child("a1", e, ev(d.clock, "a1", s + 2, e, position=2), new_run("a1.kid", tenant="acme"))
    d.acme.suspend_run("a1", e, ev(d.clock, "a1", s + 3, e, EventType.RUN_SUSPENDED), None, "a1.kid")
    d.acme.set_budget("a1", {"tokens": 5})  # while it waits: a completed run's budget cannot change
    finish(d.acme, d.clock, claim(d.acme, "a1.kid"))
    c = claim(d.acme, "a1")  # woken by its child
    assert c.history[-1].event is EventType.RUN_WOKEN
    finish(d.acme, d.clock, c)
    assert d.acme.get_artifact(ref) == b"x" * 100_000
    with pytest.raises(PayloadError, match="missing"):  # readable only through a reference one owns
        d.globex.get_artifact(ref)
    assert d.acme.kill_runs("stop", tenant="acme") == []  # nothing left running
    tenants = _rows(d.admin_url, "SELECT DISTINCT tenant FROM history")
    assert tenants == [("acme",)]


def test_the_owner_sees_every_tenant(deployment: Deployment) -> None:
    d = deployment
    running(d.acme, d.clock, "a1")
    d.globex.create_run(new_run("g1", tenant="globex"))
    everyone = {(r.run_id, r.tenant) for r in d.owner.list_runs(RunFilter())}
    assert everyone == {("a1", "acme"), ("g1", "globex")}
    assert d.owner.history("a1")[0].event is EventType.RUN_CREATED
    rows = d.as_role("owner", "SELECT run_id, tenant, count(*) FROM history GROUP BY run_id, tenant "
                     "ORDER BY run_id")
    assert rows == [("a1", "acme", 3), ("g1", "globex", 1)]
    killed = d.owner.kill_runs("everyone", tenant="acme")
    assert [r.run_id for r in killed] == ["a1"]


def test_a_role_without_a_tenant_setting_sees_its_granted_tenants_only(deployment: Deployment) -> None:
    """The setting narrows what a role sees; without it the role sees every
    tenant granted to it, and nothing else."""
    d = deployment
    d.acme.create_run(new_run("a1", tenant="acme"))
    d.globex.create_run(new_run("g1", tenant="globex"))
    unscoped = PostgresStore(d.urls["acme"], schema=SCHEMA, clock=d.clock)
    try:
        assert unscoped.get_run("g1") is None
        assert [r.run_id for r in unscoped.list_runs(RunFilter())] == ["a1"]
        with pytest.raises(StoreError, match="row-level security"):
            unscoped.create_run(new_run("g2", tenant="globex"))
    finally:
        unscoped.close()


def test_every_pooled_connection_is_scoped(deployment: Deployment) -> None:
    store = PostgresStore(deployment.urls["acme"], schema=SCHEMA, tenant="acme", pool_size=4)
    try:
        with contextlib.ExitStack() as stack:
            conns = [stack.enter_context(store._conn()) for _ in range(4)]
            assert len({conn.info.backend_pid for conn in conns}) == 4
            settings = [conn.execute("SELECT current_setting('cairn.tenant', true)").fetchone()
                        for conn in conns]
            assert settings == [("acme",)] * 4
    finally:
        store.close()


def test_a_scoped_store_does_not_prune(deployment: Deployment) -> None:
    d = deployment
    running(d.acme, d.clock, "a1")
    d.acme.create_run(new_run("a2", tenant="acme"))
    d.acme.cancel_run("a2", "x")
    d.globex.create_run(new_run("g1", tenant="globex"))
    d.globex.cancel_run("g1", "x")
    d.clock.advance(10)
    assert d.acme.prune_runs(d.clock(), dry_run=True) == 1  # counting its own runs is harmless
    with pytest.raises(StoreError, match="cannot prune"):
        d.acme.prune_runs(d.clock())
    assert d.owner.prune_runs(d.clock()) == 2
    assert [r.run_id for r in d.owner.list_runs(RunFilter())] == ["a1"]


def test_a_scoped_store_does_not_migrate(deployment: Deployment) -> None:
    """Migrations are the owner's: a scoped role opening a schema that lacks
    one gets a one-line error instead of a half-applied migration."""
    d = deployment
    d.as_role("owner", "DELETE FROM schema_migrations WHERE version = (SELECT max(version) "
              "FROM schema_migrations)")
    with pytest.raises(StoreError, match="cannot open PostgreSQL database") as info:
        PostgresStore(d.urls["acme"], schema=SCHEMA, tenant="acme")
    assert "\n" not in str(info.value)


def test_tenant_must_not_be_empty(pg_url: str) -> None:
    with pytest.raises(ValueError, match="tenant"):
        PostgresStore(pg_url, tenant="")


def test_queue_limits_hold_across_scoped_tenants(deployment: Deployment) -> None:
    """A queue-wide limit counts every tenant's running runs, though each
    scoped role sees only its own; a scoped role cannot change the limits."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", concurrency=3, rate=Rate(100, 1.0)))
    for tenant, store in (("acme", d.acme), ("globex", d.globex)):
        for i in range(3):
            store.create_run(new_run(f"{tenant}-{i}", tenant=tenant, queue="q"))
    assert len(d.acme.claim_runs("aw", [WF], 2, 30.0, 3)) == 2
    assert [c.run.tenant for c in d.globex.claim_runs("gw", [WF], 5, 30.0, 3)] == ["globex"]
    assert d.globex.claim_runs("gw", [WF], 5, 30.0, 3) == []
    with pytest.raises(StoreError, match="permission denied"):
        d.acme.set_queue(QueueLimits("q", concurrency=100))
    stats = {s.limits.name: s for s in d.acme.queue_stats()}
    assert stats["q"].limits.concurrency == 3
    assert stats["q"].running == 2  # its own: the other tenant's runs stay invisible


def test_a_tenant_share_holds_for_its_scoped_role_alone(deployment: Deployment) -> None:
    """Issue 21: acme's own share caps acme's claims made by acme's role;
    globex's role claims as if there were none, sees none of acme's, and
    neither role can write a share (the owner writes them)."""
    d = deployment
    d.owner.set_queue_share(QueueShare("q", "acme", 1))
    for tenant, store in (("acme", d.acme), ("globex", d.globex)):
        for i in range(3):
            store.create_run(new_run(f"{tenant}-{i}", tenant=tenant, queue="q"))
    assert [c.run.tenant for c in d.acme.claim_runs("aw", [WF], 5, 30.0, 3)] == ["acme"]
    assert d.acme.claim_runs("aw2", [WF], 5, 30.0, 3) == []
    assert len(d.globex.claim_runs("gw", [WF], 5, 30.0, 3)) == 3
    assert d.acme.queue_shares() == [QueueShare("q", "acme", 1)]
    assert d.globex.queue_shares() == []
    for store, tenant in ((d.acme, "acme"), (d.globex, "acme"), (d.globex, "globex")):
        with pytest.raises(StoreError, match="permission denied"):
            store.set_queue_share(QueueShare("q", tenant, 100))
    assert d.owner.queue_shares() == [QueueShare("q", "acme", 1)]


def test_a_tenant_rate_share_holds_for_its_scoped_role_alone(deployment: Deployment) -> None:
    """Issue 21: acme's own rate share (2 an hour) holds acme's claims made
    by acme's role; globex's role claims as if there were none and reads
    none of acme's; neither role writes a share."""
    d = deployment
    d.owner.set_queue_share(QueueShare("q", "acme", rate=Rate(2, 3600)))
    for tenant, store in (("acme", d.acme), ("globex", d.globex)):
        for i in range(4):
            store.create_run(new_run(f"{tenant}-{i}", tenant=tenant, queue="q"))
    assert [c.run.tenant for c in d.acme.claim_runs("aw", [WF], 5, 30.0, 3)] == ["acme", "acme"]
    assert d.acme.claim_runs("aw2", [WF], 5, 30.0, 3) == []
    assert len(d.globex.claim_runs("gw", [WF], 5, 30.0, 3)) == 4
    assert d.acme.queue_shares() == [QueueShare("q", "acme", rate=Rate(2, 3600))]
    assert d.globex.queue_shares() == []
    for store, tenant in ((d.acme, "acme"), (d.globex, "acme"), (d.globex, "globex")):
        with pytest.raises(StoreError, match="permission denied"):
            store.set_queue_share(QueueShare("q", tenant, rate=Rate(1000, 1)))
    d.clock.advance(1800)  # one token back (and the leases expired: takeovers spend none)
    got = sorted(c.run.run_id for c in d.acme.claim_runs("aw", [WF], 5, 30.0, 3))
    assert got == ["acme-0", "acme-1", "acme-2"]


def test_a_share_bucket_is_spent_only_by_claims_made(deployment: Deployment) -> None:
    """spend_share_tokens charges nothing for a tenant's role (its claims
    are charged as they commit, migration 0027): called by another tenant's
    role (or by acme's own outside a claim), with a huge count, it leaves
    acme's bucket as it was. (tests/store/test_pg_claim_admission.py calls
    it inside real claims, again and again.)"""
    d = deployment
    _acme_world(d)
    query = "SELECT tokens, refilled_at FROM queue_shares WHERE queue = 'q' AND tenant = 'acme'"
    [before] = d.as_role("owner", query)
    assert before[0] is not None  # acme's claim spent a token of its share
    attack = "SELECT spend_share_tokens(ARRAY['q'], ARRAY['acme'], ARRAY[1000000000]::bigint[], 1e12)"
    _attack(d, "globex", attack, {})
    d.as_role("acme", attack)  # acme's own role, outside a claim
    assert d.as_role("owner", query) == [before]


# -- the attacker's matrix (issue 9, item 1) ---------------------------------------------------
#
# A tenant's role (globex) with raw SQL, under its own setting, a forged one
# (acme's) and none, tries to read and write every table of another tenant
# (acme). Reads must return nothing of acme's; afterwards every row the owner
# sees of acme's (and every shared row) must be exactly as before.

SECRET = b"acme's secret step result " * 5_000  # stored as an artifact (above the lookup threshold)
SECRET_SIGNAL = b"acme's secret signal payload " * 5_000  # referenced by acme's mailbox only
SECRET_MEMORY = b'"' + b"acme's secret memory " * 15_000 + b'"'  # referenced by acme's memory only
ACME_NS = encode_namespace(("users", "u1"))


def _acme_world(d: Deployment) -> str:
    """Runs, history, an artifact, buckets and limits of acme (and a run of
    globex's own); returns the reference of acme's artifact."""
    d.owner.set_queue(QueueLimits("q", concurrency=10, rate=Rate(100, 1.0), tenant_rate=Rate(100, 1.0)))
    d.owner.set_queue_share(QueueShare("q", "acme", 5, Rate(50, 1.0)))  # a1's claim spends its bucket
    d.acme.create_run(new_run("a1", tenant="acme", queue="q"))
    [a] = d.acme.claim_runs("aw", [WF], 1, 30.0, 3)
    ref = d.acme.put_artifact(SECRET)
    step = ev(d.clock, "a1", a.next_seq, a.run.epoch)
    d.acme.append("a1", a.run.epoch, [dataclasses.replace(step, payload=Payload(ref=ref))])
    d.acme.deliver("a1", "signal:go", Payload(data=b'"acme\'s signal"'), sender="cli:acme", dedupe="op-a")
    d.acme.deliver("a1", "signal:big", Payload(ref=d.acme.put_artifact(SECRET_SIGNAL)))
    asked = ev(d.clock, "a1", a.next_seq + 1, a.run.epoch, position=1, step_kind="approval", name="refund",
               payload=Payload(data=b'{"cents": 1250}'))
    d.acme.request_approval("a1", a.run.epoch, asked, ApprovalRequest(
        "req-a1", "refund", "dict", None, ("cli:boss@acme",), None))
    d.globex.create_run(new_run("g1", tenant="globex", queue="q"))
    assert [c.run.run_id for c in d.globex.claim_runs("gw", [WF], 1, 30.0, 3)] == ["g1"]
    # an erasure of acme's (issue 26): its record is the owner's, no tenant's role reads or edits it
    d.owner.start_erasure(ErasureRecord("er-acme", "acme", "subject", "d" * 64, "cli:ops", 0.0, None, {}))
    d.owner.note_erased_runs("er-acme", ["e" * 64])
    # schedules (tests/schedules): acme's, fired once, and one of globex's own
    d.acme.register_schedule(ScheduleSpec("acme", "nightly", WF, "* * * * *", "UTC", "once", 60.0))
    assert d.acme.fire_schedule("acme", "nightly", d.clock.now + 60, new_run(
        tick_run_id("acme", "nightly", d.clock.now + 60), tenant="acme")) is Fired.CREATED
    d.globex.register_schedule(ScheduleSpec("globex", "nightly", WF, "* * * * *", "UTC", "once", 60.0))
    assert d.acme.get_artifact(ref) == SECRET
    # the HTTP API's tokens (cairn.server): one of each tenant
    d.acme.create_token(TokenRecord("acmetoken0000001", "acme", "admin", "acme-admin", "d" * 64, 0.0))
    d.globex.create_token(TokenRecord("globextoken00001", "globex", "viewer", "globex-bot", "e" * 64, 0.0))
    d.acme.put_bundles([ACME_BUNDLE.record()])  # any role may add a bundle (application definitions)
    # memory (issue 14): every tier, written by acme's run and by an operator; one value offloaded
    memory_ref = d.acme.put_artifact(SECRET_MEMORY)
    d.acme.append_memory("a1", a.run.epoch, [ev(d.clock, "a1", a.next_seq + 2, a.run.epoch, position=2)], [
        ItemPut(ACME_NS, "pref", Payload(ref=memory_ref), {"k": "v"}, "acme's index text", 60.0),
        RunPut("note", Payload(data=b'"acme\'s note"')),
        ThreadAppend("th", (Payload(data=b'"acme\'s message"'),), 60.0)], Provenance("a1", 2, "op-2"))
    d.globex.write_memory("globex", [ItemPut(ACME_NS, "pref", Payload(data=b'"globex"'), None, "g", None),
                                     ThreadAppend("th", (Payload(data=b'"globex"'),), None)],
                          Provenance(actor="globex-op"))
    # the cold tier: a value of acme's compressed out of its row (memory_item_cold)
    cold = Payload(data=b'"' + b"acme's cold secret " * 20 + b'"')
    d.acme.write_memory("acme", [ItemPut(ACME_NS, "cold", cold)], Provenance(actor="acme-op"))
    # a workspace object of acme's run (issue 27, migration 0030), and globex's copy of the same id
    d.acme.put_workspace_objects("a1", a.run.epoch, {"ab" * 32: b"acme's workspace file"})
    d.clock.advance(1.0)
    assert d.acme.tier_items(0.5).cooled == 1
    # semantic memory: an item of acme's with its vector, a pending outbox row, and a vector of globex's
    memory_world(d)
    # a LangGraph thread of acme's (cairn.langgraph.CairnSaver's tables), through the store's own methods
    key = ThreadKey("acme", "lg-thread", "")
    row = CheckpointRow("lg-thread", "", "c1", None, "msgpack", b"acme ckpt", "msgpack", b"meta")
    d.acme.lg_put(key, Holder("acme-saver", None), row, "acme-run",
                  [BlobRow("ch", "1", "value", pack_refs([7]))],
                  [ValueRow(7, "msgpack", b"acme's checkpoint secret")], max_depth=8)
    d.acme.lg_put_writes(key, Holder("acme-saver", 1), "c1",
                         [WriteRow("task", 0, "ch", "", "value", pack_refs([7]))], [])
    for _ in range(2):  # two collections counted, as acme's prunes leave them (migration 0052)
        d.acme._operate(lambda tx: d.acme._query(tx, "lg_count_collection",
                                                 {"tenant": "acme", "thread_id": "lg-thread"}))
    # an archived run of acme's (issue 26 item 5; archived by the owner), its step's payload an artifact
    d.acme.create_run(new_run("a-arch", tenant="acme"))
    c = claim(d.acme, "a-arch")
    archived_ref = d.acme.put_artifact(b"archived")
    step = ev(d.clock, "a-arch", c.next_seq, c.run.epoch, payload=Payload(ref=archived_ref))
    d.acme.append("a-arch", c.run.epoch, [step])
    finish(d.acme, d.clock, c, seq=c.next_seq + 1)
    d.owner.archive_run("a-arch")
    # retention (issue 26 part 3): acme's policy, the controller's lease, a deleted run's record
    d.acme.set_retention_policy(retention.policy("acme", None, "model-bodies", "7d"), "acme-op")
    assert d.owner.take_retention_lease("owner-controller", 3600.0) == 1
    d.as_role("owner", "INSERT INTO retention_deleted (run_id, tenant, workflow, finished_at, last_seq, "
                       "deleted_at, deleted_by) VALUES ('a-gone', 'acme', 'wf', 0, 3, 0, 'cli:root')")
    # the operator log (issue 26): a record of acme's, appended by its role through the store
    mint = OperatorAction("acme", "token", "t-a", "token.mint", "http:acme#1", "api-token",
                          {"name": "acme-bot"})
    d.acme._operate(lambda tx: d.acme.record_operator_action(tx, mint))
    return ref


#: A bundle a tenant's role stored; and forgeries of it: the same id with
#: other content, and valid content under columns that are not its own.
ACME_BUNDLE = Bundle.build("wf", "1", "ast:acme", {"system": "acme's prompt"}, {}, [])
_FORGED = Bundle.build("wf", "1", "ast:evil", {"system": "evil"}, {}, [])

SNAPSHOTS = {
    # served_at left out: any role may say it serves a bundle, by design; and
    # bundles of real code (``reach:``, or before it ``ast:``, + 32 hex digits),
    # which the apps of these tests store for their own workflows, legitimately:
    # the attacks use codes of their own ('ast:acme', 'ast:evil')
    "bundles": "SELECT bundle_id, workflow, version, code, content, created_at FROM bundles "
               "WHERE code !~ '^(ast|reach):[0-9a-f]{32}$' ORDER BY bundle_id",
    "runs": "SELECT * FROM runs WHERE tenant <> 'globex' ORDER BY run_id",
    "history": "SELECT * FROM history WHERE tenant <> 'globex' OR run_id <> 'g1' ORDER BY run_id, seq",
    "artifacts": "SELECT * FROM artifacts ORDER BY ref",
    "artifact_gc": "SELECT * FROM artifact_gc ORDER BY ref",
    "queues": "SELECT * FROM queues ORDER BY name",
    "queue_buckets": "SELECT * FROM queue_buckets WHERE tenant <> 'globex' ORDER BY queue, tenant",
    "queue_shares": "SELECT * FROM queue_shares ORDER BY queue, tenant",
    "schema_migrations": "SELECT * FROM schema_migrations ORDER BY version",
    "tenant_grants": "SELECT * FROM tenant_grants ORDER BY role, tenant",
    "mailbox": "SELECT * FROM mailbox WHERE tenant <> 'globex' OR run_id <> 'g1' ORDER BY run_id, seq",
    "approvals": "SELECT * FROM approvals WHERE tenant <> 'globex' OR run_id <> 'g1' "
                 "ORDER BY run_id, request_id",
    "api_tokens": "SELECT * FROM api_tokens ORDER BY token_id",
    "schedules": "SELECT * FROM schedules WHERE tenant <> 'globex' ORDER BY tenant, name",
    "tenant_privileges": "SELECT * FROM tenant_privileges ORDER BY object_name",
    # memory: globex's own rows are left out unless they name acme's run (a forged provenance)
    "memory_run": "SELECT * FROM memory_run WHERE tenant <> 'globex' OR run_id = 'a1' ORDER BY run_id, key",
    "memory_threads": "SELECT * FROM memory_threads WHERE tenant <> 'globex' ORDER BY tenant, thread_id",
    "memory_thread_messages": "SELECT * FROM memory_thread_messages "
                              "WHERE tenant <> 'globex' OR run_id = 'a1' "
                              "ORDER BY tenant, thread_id, idx",
    "memory_items": "SELECT * FROM memory_items WHERE tenant <> 'globex' OR run_id = 'a1' "
                    "ORDER BY tenant, namespace, key",
    "memory_outbox": "SELECT * FROM memory_outbox WHERE tenant <> 'globex' ORDER BY id",
    "memory_vectors": "SELECT * FROM memory_vectors WHERE tenant <> 'globex' ORDER BY tenant, namespace, key",
    "memory_item_cold": "SELECT * FROM memory_item_cold WHERE tenant <> 'globex' "
                        "ORDER BY tenant, namespace, key",
    "lg_checkpoints": "SELECT * FROM lg_checkpoints WHERE tenant <> 'globex' "
                      "ORDER BY tenant, thread_id, ns, checkpoint_id",
    "lg_blobs": "SELECT * FROM lg_blobs WHERE tenant <> 'globex' "
                "ORDER BY tenant, thread_id, ns, channel, version",
    "lg_writes": "SELECT * FROM lg_writes WHERE tenant <> 'globex' "
                 "ORDER BY tenant, thread_id, ns, checkpoint_id, task_id, idx",
    "lg_values": "SELECT * FROM lg_values WHERE tenant <> 'globex' ORDER BY tenant, thread_id, digest",
    "lg_threads": "SELECT * FROM lg_threads WHERE tenant <> 'globex' ORDER BY tenant, thread_id",
    "data_keys": "SELECT * FROM data_keys WHERE tenant <> 'globex' ORDER BY tenant, version",
    "workspace_objects": "SELECT * FROM workspace_objects WHERE tenant <> 'globex' ORDER BY tenant, oid",
    # the audit chain's tables: no tenant role is granted them (an operator's)
    "audit_checkpoints": "SELECT * FROM audit_checkpoints ORDER BY tenant, id",
    "audit_legacy": "SELECT * FROM audit_legacy ORDER BY run_id",
    # erasure records (issue 26): the owner's alone, like the audit tables
    "erasures": "SELECT * FROM erasures ORDER BY id",
    # archived runs (a tenant's role reads its own; only the owner writes)
    "run_archives": "SELECT * FROM run_archives ORDER BY run_id",
    "run_archive_refs": "SELECT * FROM run_archive_refs ORDER BY run_id, ref",
    # retention (issue 26 part 3): a tenant's own policies; the lease and the records the owner's
    "retention_policies": "SELECT * FROM retention_policies WHERE tenant <> 'globex' "
                          "ORDER BY tenant, workflow, data_class",
    "retention_lease": "SELECT * FROM retention_lease ORDER BY name",
    "retention_deleted": "SELECT * FROM retention_deleted ORDER BY run_id",
    # the operator log (issue 26): a tenant's role reads and appends its own records only
    "operator_log": "SELECT * FROM operator_log WHERE tenant <> 'globex' ORDER BY tenant, seq",
}

#: (table, statement): reads of acme's rows, which must return no row.
READS = [
    ("runs", "SELECT run_id FROM runs WHERE tenant = 'acme' OR run_id = 'a1'"),
    ("runs", "SELECT run_id FROM runs WHERE run_id = 'a1' FOR UPDATE"),
    ("history", "SELECT seq FROM history WHERE tenant = 'acme' OR run_id = 'a1'"),
    ("artifacts", "SELECT ref FROM artifacts WHERE ref = %(ref)s"),
    ("artifacts", "SELECT ref FROM artifacts"),
    ("artifact_gc", "SELECT ref FROM artifact_gc"),
    ("queue_buckets", "SELECT tenant FROM queue_buckets WHERE tenant = 'acme'"),
    ("queue_shares", "SELECT tenant, concurrency FROM queue_shares WHERE tenant = 'acme'"),
    ("queue_shares", "SELECT tenant FROM queue_shares FOR UPDATE"),
    ("tenant_grants", "SELECT tenant FROM tenant_grants WHERE tenant = 'acme'"),
    ("mailbox", "SELECT seq FROM mailbox WHERE tenant = 'acme' OR run_id = 'a1'"),
    ("mailbox", "SELECT payload_ref FROM mailbox WHERE payload_ref IS NOT NULL"),
    ("approvals", "SELECT request_id FROM approvals WHERE tenant = 'acme' OR run_id = 'a1'"),
    ("artifacts", "SELECT ref FROM artifacts AS a WHERE a.data = %(signal)s"),
    ("functions", "SELECT * FROM queue_running_totals(ARRAY['q']) WHERE false"),  # totals only: see the doc
    ("api_tokens", "SELECT token_id, digest FROM api_tokens WHERE tenant = 'acme'"),
    ("schedules", "SELECT name FROM schedules WHERE tenant = 'acme'"),
    ("schedules", "SELECT name FROM schedules WHERE tenant = 'acme' FOR UPDATE"),
    ("memory_run", "SELECT key, value FROM memory_run WHERE tenant = 'acme' OR run_id = 'a1'"),
    ("memory_threads", "SELECT thread_id FROM memory_threads WHERE tenant = 'acme'"),
    ("memory_thread_messages", "SELECT idx, value FROM memory_thread_messages WHERE tenant = 'acme' "
                               "OR run_id = 'a1'"),
    ("memory_items", "SELECT key, value_ref, index_text FROM memory_items "
                     "WHERE tenant = 'acme' OR run_id = 'a1'"),
    ("memory_items", "SELECT key FROM memory_items WHERE tenant = 'acme' FOR UPDATE"),
    ("memory_outbox", "SELECT id FROM memory_outbox WHERE tenant = 'acme'"),
    ("artifacts", "SELECT ref FROM artifacts AS a WHERE a.data = %(memory)s"),
    ("memory_items", "SELECT key FROM memory_items WHERE tenant = 'acme'"),
    ("memory_outbox", "SELECT key FROM memory_outbox WHERE tenant = 'acme'"),
    ("memory_vectors", "SELECT key, embedding FROM memory_vectors WHERE tenant = 'acme'"),
    ("memory_vectors", "SELECT key FROM memory_vectors WHERE tenant = 'acme' FOR UPDATE"),
    ("memory_item_cold", "SELECT key, value FROM memory_item_cold"),
    ("memory_item_cold", "SELECT key FROM memory_item_cold WHERE tenant = 'acme' FOR UPDATE"),
    ("lg_checkpoints", "SELECT checkpoint, metadata FROM lg_checkpoints WHERE tenant = 'acme'"),
    ("lg_checkpoints", "SELECT checkpoint_id FROM lg_checkpoints FOR UPDATE"),
    ("lg_blobs", "SELECT refs FROM lg_blobs WHERE tenant = 'acme'"),
    ("lg_writes", "SELECT refs FROM lg_writes WHERE tenant = 'acme'"),
    ("lg_values", "SELECT data FROM lg_values WHERE tenant = 'acme'"),
    ("lg_values", "SELECT data FROM lg_values WHERE digest = 7"),
    ("lg_threads", "SELECT owner FROM lg_threads WHERE tenant = 'acme'"),
    ("data_keys", "SELECT wrapped FROM data_keys WHERE tenant = 'acme'"),
    ("workspace_objects", "SELECT data FROM workspace_objects WHERE tenant = 'acme'"),
    ("audit_checkpoints", "SELECT record FROM audit_checkpoints"),
    ("audit_legacy", "SELECT run_id FROM audit_legacy"),
    ("erasures", "SELECT digest, runs FROM erasures"),
    ("retention_policies", "SELECT keep FROM retention_policies WHERE tenant = 'acme'"),
    ("retention_lease", "SELECT holder FROM retention_lease"),
    ("retention_deleted", "SELECT run_id FROM retention_deleted"),
    ("operator_log", "SELECT actor, change FROM operator_log WHERE tenant = 'acme'"),
    ("operator_log", "SELECT seq FROM operator_log WHERE tenant = 'acme' FOR UPDATE"),
]

#: (table, statement): writes to acme's rows or to shared state, which must change nothing.
WRITES = [
    ("runs", "UPDATE runs SET status = 'killed', epoch = epoch + 1 WHERE run_id = 'a1'"),
    ("runs", "UPDATE runs SET tenant = 'acme' WHERE run_id = 'g1'"),
    ("runs", "DELETE FROM runs WHERE run_id = 'a1'"),
    ("runs", "INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, updated_at) "
             "VALUES ('evil', 'acme', 'wf', '1', 'pending', 0, 0)"),
    ("history", "UPDATE history SET detail = 'evil' WHERE run_id = 'a1'"),
    ("history", "DELETE FROM history WHERE run_id = 'a1'"),
    ("history", "INSERT INTO history (run_id, seq, event, at, epoch, tenant) "
                "VALUES ('a1', 99, 'run.completed', 0, 0, 'acme')"),
    # a row of acme's run that claims globex's tenant (which globex may write)
    ("history", "INSERT INTO history (run_id, seq, event, at, epoch, tenant) "
                "VALUES ('a1', 98, 'run.completed', 0, 0, 'globex')"),
    ("artifacts", "UPDATE artifacts SET data = 'evil' WHERE ref = %(ref)s"),
    ("artifacts", "UPDATE artifacts SET touched_at = 1e300"),
    ("artifacts", "DELETE FROM artifacts"),
    ("artifacts", "INSERT INTO artifacts (ref, data, touched_at) VALUES (%(next_ref)s, 'evil', 0)"),
    ("artifact_gc", "DELETE FROM artifact_gc"),
    ("artifact_gc", "INSERT INTO artifact_gc (ref, queued_at) VALUES ('x', 0)"),
    ("queues", "UPDATE queues SET rate_limit = 1, concurrency = 1"),
    ("queues", "UPDATE queues SET updated_at = 0"),
    ("queues", "DELETE FROM queues"),
    ("queues", "INSERT INTO queues (name, concurrency, updated_at) VALUES ('q2', 1, 0)"),
    ("queue_buckets", "UPDATE queue_buckets SET tokens = -1e9"),
    ("queue_buckets", "DELETE FROM queue_buckets"),
    ("queue_buckets", "INSERT INTO queue_buckets VALUES ('q', '', -1e9, 1e12) "
                      "ON CONFLICT (queue, tenant) DO UPDATE SET tokens = -1e9, refilled_at = 1e12"),
    ("queue_buckets", "INSERT INTO queue_buckets VALUES ('q', 'acme', -1e9, 1e12) "
                      "ON CONFLICT (queue, tenant) DO UPDATE SET tokens = -1e9, refilled_at = 1e12"),
    ("queue_buckets", "INSERT INTO queue_buckets VALUES ('q3', '', -1e9, 1e12)"),
    ("queue_shares", "UPDATE queue_shares SET concurrency = 1000000"),
    ("queue_shares", "UPDATE queue_shares SET updated_at = 0"),
    ("queue_shares", "UPDATE queue_shares SET tokens = 1e9, refilled_at = 1e12"),
    ("queue_shares", "UPDATE queue_shares SET rate_limit = NULL, rate_period = NULL"),
    ("queue_shares", "SELECT spend_share_tokens(ARRAY['q'], ARRAY['acme'], "
                     "ARRAY[1000000000]::bigint[], 1e12)"),
    ("queue_shares", "SELECT spend_share_tokens(ARRAY['q'], ARRAY['acme'], "
                     "ARRAY[-1000000000]::bigint[], 1e12)"),
    ("queue_shares", "DELETE FROM queue_shares"),
    ("queue_shares", "INSERT INTO queue_shares VALUES ('q', 'acme', 1, 0) "
                     "ON CONFLICT (queue, tenant) DO UPDATE SET concurrency = 1"),
    ("queue_shares", "INSERT INTO queue_shares VALUES ('q', 'globex', 1000, 0)"),
    ("schema_migrations", "UPDATE schema_migrations SET name = 'evil'"),
    ("schema_migrations", "DELETE FROM schema_migrations"),
    ("schema_migrations", "INSERT INTO schema_migrations VALUES (999, 'evil', 0)"),
    ("tenant_grants", "INSERT INTO tenant_grants VALUES (current_user, 'acme')"),
    ("tenant_grants", "UPDATE tenant_grants SET tenant = 'acme'"),
    ("tenant_grants", "DELETE FROM tenant_grants"),
    ("mailbox", "UPDATE mailbox SET taken_at = 1, taken_position = 0 WHERE run_id = 'a1'"),
    ("mailbox", "UPDATE mailbox SET tenant = 'globex' WHERE run_id = 'a1'"),
    ("mailbox", "DELETE FROM mailbox WHERE run_id = 'a1'"),
    ("mailbox", "UPDATE mailbox SET run_id = 'a1', seq = seq + 100 WHERE run_id = 'g1'"),
    ("mailbox", "INSERT INTO mailbox (run_id, seq, tenant, key, sent_at) "
                "VALUES ('a1', 99, 'acme', 'signal:go', 0)"),
    ("mailbox", "INSERT INTO mailbox (run_id, seq, tenant, key, sent_at) "
                "VALUES ('a1', 98, 'globex', 'signal:go', 0)"),
    ("api_tokens", "UPDATE api_tokens SET role = 'viewer', revoked_at = 1 WHERE tenant = 'acme'"),
    ("api_tokens", "UPDATE api_tokens SET tenant = 'acme', role = 'admin' WHERE tenant = 'globex'"),
    ("api_tokens", "DELETE FROM api_tokens"),
    ("api_tokens", "INSERT INTO api_tokens (token_id, tenant, role, name, digest, created_at) "
                   "VALUES ('evil000000000001', 'acme', 'admin', 'evil', 'f', 0)"),
    ("approvals", "UPDATE approvals SET status = 'approved', decided_by = 'evil' WHERE run_id = 'a1'"),
    ("approvals", "DELETE FROM approvals WHERE run_id = 'a1'"),
    ("approvals", "INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, action, "
                  "type_name, requested_at) VALUES ('a1', 'forged', 'globex', 9, 9, 'x', 'dict', 0)"),
    ("approvals", "INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, action, "
                  "type_name, requested_at) VALUES ('a1', 'forged2', 'acme', 9, 9, 'x', 'dict', 0)"),
    ("schedules", "UPDATE schedules SET last_tick = 1e12, fired = 0 WHERE tenant = 'acme'"),
    ("schedules", "UPDATE schedules SET tenant = 'acme', name = 'x' WHERE tenant = 'globex'"),
    ("schedules", "DELETE FROM schedules"),
    ("schedules", "INSERT INTO schedules (tenant, name, workflow, cron, timezone, missed, grace, created_at, "
                  "updated_at) VALUES ('acme', 'evil', 'wf', '* * * * *', 'UTC', 'once', 1, 0, 0)"),
    ("schedules", "INSERT INTO schedules (tenant, name, workflow, cron, timezone, missed, grace, created_at, "
                  "updated_at) VALUES ('acme', 'nightly', 'wf', '* * * * *', 'UTC', 'once', 1, 0, 0) "
                  "ON CONFLICT (tenant, name) DO UPDATE SET last_tick = 1e12"),
    ("bundles", "UPDATE bundles SET content = 'evil'"),
    ("bundles", "UPDATE bundles SET workflow = 'evil', code = 'evil', created_at = 0"),
    ("bundles", "DELETE FROM bundles"),
    ("bundles", f"INSERT INTO bundles (bundle_id, workflow, version, code, content, created_at) "
                f"VALUES ('{ACME_BUNDLE.bundle_id}', 'wf', '1', 'ast:evil', 'evil', 0) "
                "ON CONFLICT (bundle_id) DO UPDATE SET content = excluded.content"),
    ("bundles", f"INSERT INTO bundles (bundle_id, workflow, version, code, content, created_at) "
                f"VALUES ('bevil', 'wf', '1', 'ast:evil', '{_FORGED.content.decode()}', 0)"),
    ("bundles", f"INSERT INTO bundles (bundle_id, workflow, version, code, content, created_at) "
                f"VALUES ('{_FORGED.bundle_id}', 'wf', '2', 'ast:acme', '{_FORGED.content.decode()}', 0)"),
    # what grant_tenant grants is data: a role that could change it would
    # grant itself (and every later role) anything
    ("tenant_privileges", "UPDATE tenant_privileges SET privileges = 'ALL'"),
    ("tenant_privileges", "INSERT INTO tenant_privileges VALUES ('tenant_grants', 'TABLE', 'ALL')"),
    ("tenant_privileges", "DELETE FROM tenant_privileges"),
    ("memory_run", "UPDATE memory_run SET value = 'evil' WHERE run_id = 'a1'"),
    ("memory_run", "DELETE FROM memory_run"),
    ("memory_run", "INSERT INTO memory_run (run_id, key, tenant, version, created_at, updated_at) "
                   "VALUES ('a1', 'evil', 'acme', 1, 0, 0)"),
    ("memory_run", "INSERT INTO memory_run (run_id, key, tenant, version, created_at, updated_at) "
                   "VALUES ('a1', 'evil', 'globex', 1, 0, 0)"),  # globex's tenant on acme's run
    ("memory_threads", "UPDATE memory_threads SET next_idx = 0, expires_at = 0 WHERE tenant = 'acme'"),
    ("memory_threads", "UPDATE memory_threads SET tenant = 'acme' WHERE tenant = 'globex'"),
    ("memory_threads", "DELETE FROM memory_threads"),
    ("memory_threads", "INSERT INTO memory_threads (tenant, thread_id, next_idx, created_at, updated_at, "
                       "accessed_at) VALUES ('acme', 'th', 0, 0, 0, 0) "
                       "ON CONFLICT (tenant, thread_id) DO UPDATE SET next_idx = 0"),
    ("memory_thread_messages", "UPDATE memory_thread_messages SET value = 'evil' WHERE tenant = 'acme'"),
    ("memory_thread_messages", "DELETE FROM memory_thread_messages"),
    ("memory_thread_messages", "INSERT INTO memory_thread_messages "
                               "(tenant, thread_id, idx, kind, created_at) "
                               "VALUES ('acme', 'th', 9, 'message', 0)"),
    ("memory_thread_messages", "INSERT INTO memory_thread_messages "
                               "(tenant, thread_id, idx, kind, created_at, run_id) "
                               "VALUES ('globex', 'th', 9, 'message', 0, 'a1')"),  # forged provenance
    ("memory_items", "UPDATE memory_items SET value = 'evil', expires_at = 0 WHERE tenant = 'acme'"),
    ("memory_items", "UPDATE memory_items SET tenant = 'acme' WHERE tenant = 'globex'"),
    ("memory_items", "UPDATE memory_items SET run_id = 'a1' WHERE tenant = 'globex'"),
    ("memory_items", "DELETE FROM memory_items"),
    ("memory_items", "INSERT INTO memory_items (tenant, namespace, key, version, created_at, updated_at, "
                     "accessed_at) VALUES ('acme', %(ns)s, 'pref', 1, 0, 0, 0) "
                     "ON CONFLICT (tenant, namespace, key) DO UPDATE SET value = 'evil'"),
    ("memory_items", "INSERT INTO memory_items (tenant, namespace, key, version, created_at, updated_at, "
                     "accessed_at, run_id) VALUES ('globex', 'x', 'forged', 1, 0, 0, 0, 'a1')"),
    # a row of globex's own naming a made-up artifact, then deleted: the queue takes stored refs only
    ("memory_items", "INSERT INTO memory_items (tenant, namespace, key, version, created_at, updated_at, "
                     "accessed_at, value_ref) VALUES ('globex', 'gc', 'k', 1, 0, 0, 0, 'made-up')"),
    ("memory_items", "DELETE FROM memory_items WHERE tenant = 'globex' AND namespace = 'gc'"),
    ("memory_outbox", "UPDATE memory_outbox SET claimed_by = 'evil', claimed_until = 1e12"),
    ("memory_outbox", "DELETE FROM memory_outbox"),
    ("memory_outbox", "INSERT INTO memory_outbox (tenant, namespace, key, version, created_at) "
                      "VALUES ('acme', %(ns)s, 'pref', 99, 0)"),
    ("functions", "SELECT memory_queue_artifact()"),
    ("memory_vectors", "UPDATE memory_vectors SET embedding = 'evil', version = 99 WHERE tenant = 'acme'"),
    ("memory_vectors", "UPDATE memory_vectors SET tenant = 'acme' WHERE tenant = 'globex'"),
    ("memory_vectors", "DELETE FROM memory_vectors"),
    ("memory_vectors", "INSERT INTO memory_vectors (tenant, namespace, key, version, embedder, dims, "
                       "embedding, embedded_at) VALUES ('acme', 'ns\x1f', 'evil', 99, 'e', 1, 'evil', 0)"),
    ("memory_vectors", "INSERT INTO memory_vectors (tenant, namespace, key, version, embedder, dims, "
                       "embedding, embedded_at) VALUES ('acme', 'ns\x1f', 'k', 99, 'e', 1, 'evil', 0) "
                       "ON CONFLICT (tenant, namespace, key) DO UPDATE SET version = 100"),
    ("memory_items", "UPDATE memory_items SET index_text = 'evil'"),
    ("memory_items", "DELETE FROM memory_items"),
    ("memory_outbox", "DELETE FROM memory_outbox"),
    ("memory_outbox", "UPDATE memory_outbox SET claimed_by = 'evil', claimed_until = 1e300"),
    ("functions", "SELECT grant_tenant(current_user, 'acme')"),
    ("functions", "SELECT revoke_tenant(%(acme_role)s, 'acme')"),
    ("functions", "SELECT grant_privileges('runs')"),
    ("memory_item_cold", "UPDATE memory_item_cold SET value = 'evil' WHERE tenant = 'acme'"),
    ("memory_item_cold", "UPDATE memory_item_cold SET tenant = 'acme' WHERE tenant = 'globex'"),
    ("memory_item_cold", "DELETE FROM memory_item_cold"),
    ("memory_item_cold", "INSERT INTO memory_item_cold (tenant, namespace, key, codec, size, value) "
                         "VALUES ('acme', %(ns)s, 'cold', 'zlib', 1, 'evil') "
                         "ON CONFLICT (tenant, namespace, key) DO UPDATE SET value = 'evil'"),
    ("functions", "SELECT memory_drop_cold_copy()"),
    ("lg_checkpoints", "UPDATE lg_checkpoints SET checkpoint = 'evil' WHERE tenant = 'acme'"),
    ("lg_checkpoints", "DELETE FROM lg_checkpoints"),
    ("lg_checkpoints", "INSERT INTO lg_checkpoints (tenant, thread_id, ns, checkpoint_id, checkpoint_kind, "
                       "checkpoint, metadata_kind, metadata) "
                       "VALUES ('acme', 'lg-thread', '', 'c2', 'msgpack', 'evil', 'msgpack', 'evil')"),
    ("lg_blobs", "UPDATE lg_blobs SET refs = 'evil'"),
    ("lg_blobs", "DELETE FROM lg_blobs"),
    ("lg_writes", "UPDATE lg_writes SET refs = 'evil'"),
    ("lg_writes", "DELETE FROM lg_writes"),
    ("lg_values", "UPDATE lg_values SET data = 'evil'"),
    ("lg_values", "UPDATE lg_values SET tenant = 'globex'"),
    ("lg_values", "DELETE FROM lg_values"),
    ("lg_values", "INSERT INTO lg_values (tenant, thread_id, digest, kind, data) "
                  "VALUES ('acme', 'lg-thread', 7, 'msgpack', 'evil') "
                  "ON CONFLICT (tenant, thread_id, digest) DO UPDATE SET data = 'evil'"),
    # taking acme's thread away from its saver (fencing), or freeing it
    ("lg_threads", "UPDATE lg_threads SET owner = 'evil', epoch = epoch + 1"),
    ("lg_threads", "DELETE FROM lg_threads"),
    # resetting its collection count, so acme's saver builds on values a prune collected (0052)
    ("lg_threads", "UPDATE lg_threads SET collected = 0"),
    ("lg_threads", "INSERT INTO lg_threads (tenant, thread_id, owner, epoch) VALUES ('acme', 'lg-thread', "
                   "'evil', 9) ON CONFLICT (tenant, thread_id) DO UPDATE SET owner = 'evil'"),
    # the same through the server's fence (lg_hold, SECURITY INVOKER, migration 0051): taking
    # acme's thread as a new saver, as one that held it, or under a later lease
    ("functions", "SELECT lg_hold('acme', 'lg-thread', 'evil', NULL, NULL, NULL)"),
    ("functions", "SELECT lg_hold('acme', 'lg-thread', 'evil', 1, NULL, NULL)"),
    ("functions", "SELECT lg_hold('acme', 'lg-thread', 'evil', NULL, 999, NULL)"),
    ("functions", "SELECT lg_hold('acme', 'lg-thread', 'acme-saver', NULL, 999, NULL)"),
    ("functions", "SELECT lg_hold('acme', 'lg-thread', 'acme-saver', 1, NULL, 0)"),
    # a data key of acme's (encryption at rest): replacing it, planting one, or shredding it
    ("data_keys", "UPDATE data_keys SET wrapped = 'evil'"),
    ("data_keys", "DELETE FROM data_keys"),
    ("workspace_objects", "UPDATE workspace_objects SET data = 'evil'"),
    ("history", "UPDATE history SET link = 'evil', digest = 'evil' WHERE run_id = 'a1'"),
    ("audit_checkpoints", "INSERT INTO audit_checkpoints (tenant, id, at, record) "
                          "VALUES ('acme', 99, 0, 'x')"),
    ("audit_checkpoints", "DELETE FROM audit_checkpoints"),
    ("audit_legacy", "INSERT INTO audit_legacy (run_id, last_seq) VALUES ('a1', 99)"),
    ("audit_legacy", "DELETE FROM audit_legacy"),
    ("erasures", "INSERT INTO erasures (id, tenant, scope, digest, actor, started_at) "
                 "VALUES ('forged', 'acme', 'subject', 'x', 'evil', 0)"),
    ("erasures", "UPDATE erasures SET finished_at = 1, runs = '[]'"),
    ("erasures", "DELETE FROM erasures"),
    ("data_keys", "UPDATE data_keys SET kek_id = 'erased', wrapped = ''"),  # a forged crypto-shred
    ("workspace_objects", "DELETE FROM workspace_objects"),
    ("workspace_objects", "INSERT INTO workspace_objects (tenant, oid, data, stored_at) "
                          "VALUES ('acme', 'cd', 'evil', 0)"),
    ("data_keys", "INSERT INTO data_keys (tenant, version, kek_id, wrapped, created_at) "
                  "VALUES ('acme', 9, 'evil', 'evil', 0)"),
    # acme's archive: its record, the artifacts it keeps; dropping it would unfreeze the run
    ("run_archives", "SELECT run_id, ref FROM run_archives"),
    ("run_archive_refs", "SELECT ref FROM run_archive_refs"),
    ("run_archives", "DELETE FROM run_archives RETURNING run_id"),
    ("run_archive_refs", "DELETE FROM run_archive_refs RETURNING ref"),
    ("run_archives", "UPDATE run_archives SET ref = 'evil' RETURNING run_id"),
    ("run_archives", "INSERT INTO run_archives (run_id, tenant, ref, entries, last_seq, hot_bytes, "
                     "stored_bytes, archived_at) VALUES ('a1', 'acme', 'evil', 0, 0, 0, 0, 0) "
                     "RETURNING run_id"),
    ("retention_policies", "UPDATE retention_policies SET keep = 0 WHERE tenant = 'acme'"),
    ("retention_policies", "DELETE FROM retention_policies WHERE tenant = 'acme'"),
    ("retention_policies", "INSERT INTO retention_policies (tenant, workflow, data_class, keep, updated_at, "
                           "updated_by) VALUES ('acme', 'wf', 'history', 0, 0, 'evil')"),
    ("retention_policies", "INSERT INTO retention_policies (tenant, workflow, data_class, keep, updated_at, "
                           "updated_by) VALUES ('*', '*', 'history', 0, 0, 'evil')"),
    ("retention_lease", "UPDATE retention_lease SET holder = 'evil', epoch = epoch + 1"),
    ("retention_lease", "INSERT INTO retention_lease (name, holder, epoch, expires_at) "
                        "VALUES ('x', 'evil', 1, 0)"),
    ("retention_deleted", "DELETE FROM retention_deleted"),
    ("retention_deleted", "INSERT INTO retention_deleted (run_id, tenant, workflow, finished_at, last_seq, "
                          "deleted_at, deleted_by) VALUES ('g-fake', 'acme', 'wf', 0, 1, 0, 'evil')"),
    ("operator_log", "UPDATE operator_log SET actor = 'evil'"),
    ("operator_log", "DELETE FROM operator_log"),
    ("operator_log", "INSERT INTO operator_log (tenant, seq, at, kind, object_id, action, actor, auth, "
                     "change, digest, link) VALUES ('acme', 2, 0, 'token', 'x', 'token.revoke', 'evil', 'x', "
                     "'{}', '\\x00', '\\x00')"),
]

#: The session settings an attacker may choose: its own tenant, another's, none.
SETTINGS = {"own": "globex", "forged": "acme", "unset": None}


def _attack(d: Deployment, setting: str | None, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``query`` as globex's role; the rows it returned ([] if refused)."""
    with psycopg.connect(d.urls["globex"], autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        if setting is not None:
            conn.execute("SELECT set_config('cairn.tenant', %s, false)", (setting,))
        try:
            cur = conn.execute(query, params)
        except psycopg.Error:
            return []
        return cur.fetchall() if cur.description is not None else []


def _snapshot(d: Deployment) -> dict[str, list[tuple[Any, ...]]]:
    return {table: d.as_role("owner", query) for table, query in SNAPSHOTS.items()}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_tenant_role_reads_and_writes_nothing_of_another_tenant_with_raw_sql(
    deployment: Deployment, setting: str
) -> None:
    d = deployment
    ref = _acme_world(d)
    params = {"ref": ref, "next_ref": hashlib.sha256(b"acme's next result").hexdigest(),
              "acme_role": conninfo_to_dict(d.urls["acme"])["user"], "signal": SECRET_SIGNAL,
              "memory": SECRET_MEMORY, "ns": ACME_NS}
    before = _snapshot(d)
    assert before["runs"]
    assert before["history"]
    assert before["artifacts"]
    assert before["queue_buckets"]
    assert all(before[table] for table in SNAPSHOTS if table.startswith("memory_"))
    tables = {table for table, _ in READS + WRITES}
    assert tables >= set(SNAPSHOTS), "every table is attacked"
    schema_tables = {row[0] for row in d.as_role("owner", "SELECT table_name FROM information_schema.tables "
                                                          "WHERE table_schema = current_schema()")}
    assert schema_tables == set(SNAPSHOTS), "a table of the schema is missing from the attack (SNAPSHOTS)"
    leaks = [(table, query, rows) for table, query in READS
             if (rows := _attack(d, SETTINGS[setting], query, params))]
    assert leaks == []
    for _, query in WRITES:
        _attack(d, SETTINGS[setting], query, params)
    after = _snapshot(d)
    changed = {table: (before[table], after[table]) for table in SNAPSHOTS if before[table] != after[table]}
    assert changed == {}
    assert d.acme.get_artifact(ref) == SECRET
    # acme's saver still holds its thread at the epoch it held (none of lg_hold's calls took it)
    d.acme.lg_put_writes(ThreadKey("acme", "lg-thread", ""), Holder("acme-saver", 1), "c1",
                         [WriteRow("task", 1, "ch", "", "value", pack_refs([7]))], [])
    # The role still works for its own tenant (the matrix is not vacuous).
    if setting != "forged":
        own_thread = "SELECT held FROM lg_hold('globex', 'own', 'g', NULL, NULL, NULL)"
        assert _attack(d, SETTINGS[setting], own_thread, params) == [(1,)]
        assert _attack(d, SETTINGS[setting], "SELECT run_id FROM runs", params) == [("g1",)]
        assert _attack(d, SETTINGS[setting], "UPDATE runs SET priority = 1 WHERE run_id = 'g1' "
                                             "RETURNING run_id", params) == [("g1",)]
        own_item = ("INSERT INTO memory_items (tenant, namespace, key, version, created_at, updated_at, "
                    "accessed_at) VALUES ('globex', 'own', 'k', 1, 0, 0, 0) RETURNING key")
        assert _attack(d, SETTINGS[setting], own_item, params) == [("k",)]
    else:  # the forged setting narrows globex's grants to nothing
        assert _attack(d, SETTINGS[setting], "SELECT run_id FROM runs", params) == []


def test_the_queue_wide_bucket_is_charged_only_for_claims_made(deployment: Deployment) -> None:
    """spend_queue_tokens charges nothing for a tenant's role (migration
    0027): called alone, with a huge count, it cannot drain the bucket."""
    d = deployment
    _acme_world(d)
    query = "SELECT tokens FROM queue_buckets WHERE queue = 'q' AND tenant = ''"
    [(tokens,)] = d.as_role("owner", query)
    _attack(d, "globex", "SELECT spend_queue_tokens(ARRAY['q'], ARRAY[1000000000]::bigint[], 1e12)", {})
    [(after,)] = d.as_role("owner", query)
    assert after >= tokens


def test_grant_tenant_grants_what_tenant_privileges_lists_and_nothing_more(deployment: Deployment) -> None:
    """A tenant's privileges are data (migration 0014): grant_tenant gives
    exactly the listed ones, and a table added later reaches the roles
    granted before it through grant_privileges, without restating the rest."""
    d = deployment
    role = conninfo_to_dict(d.urls["globex"])["user"]
    listed = dict(d.as_role("owner", "SELECT object_name, privileges FROM tenant_privileges"))
    tables = {name for (name,) in d.as_role("owner", "SELECT tablename FROM pg_tables WHERE schemaname = %s",
                                            (SCHEMA,))}
    for table in sorted(tables):
        has = {p for p in ("SELECT", "INSERT", "UPDATE", "DELETE")
               if d.as_role("owner", "SELECT has_table_privilege(%s, %s, %s)",
                            (role, f"{SCHEMA}.{table}", p))[0][0]}
        if table == "bundles":  # granted to PUBLIC, not per tenant (0013)
            continue
        granted = listed.get(table, "").split(", ")
        wanted = {p for p in ("SELECT", "INSERT", "UPDATE", "DELETE") if p in granted}
        assert has == wanted, f"{table}: has {sorted(has)}, tenant_privileges lists {sorted(wanted)}"
    assert "DELETE" not in listed["runs"]

    d.as_role("owner", "CREATE TABLE later (tenant TEXT)")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        d.as_role("globex", "SELECT * FROM later")
    d.as_role("owner", "INSERT INTO tenant_privileges (object_name, privileges) VALUES ('later', 'SELECT')")
    d.as_role("owner", "SELECT grant_privileges('later')")
    assert d.as_role("globex", "SELECT * FROM later") == []
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        d.as_role("globex", "INSERT INTO later VALUES ('globex')")


def test_a_role_cannot_open_a_store_for_a_tenant_it_is_not_granted(deployment: Deployment) -> None:
    with pytest.raises(StoreError, match="may not act for tenant 'acme'") as info:
        PostgresStore(deployment.urls["globex"], schema=SCHEMA, tenant="acme")
    assert "\n" not in str(info.value)


def test_artifacts_cannot_be_filed_under_a_reference_they_do_not_hash_to(deployment: Deployment) -> None:
    """Poisoning: bytes stored before their owner stores them must be exactly
    the bytes, whatever reference the attacker wanted them under."""
    d = deployment
    wanted = hashlib.sha256(SECRET).hexdigest()
    stored = _attack(d, "globex", "SELECT store_artifact('evil', 0)", {})
    assert stored
    assert stored[0][0] == hashlib.sha256(b"evil").hexdigest() != wanted
    _acme_world(d)  # acme stores SECRET now
    assert d.acme.get_artifact(wanted) == SECRET


# -- every App operation, as the other tenant ---------------------------------------------------

def _outcome(call: Callable[[], Any], run_id: str) -> tuple[str, str]:
    try:
        result = call()
    except Exception as exc:
        return type(exc).__name__, str(exc).replace(repr(run_id), "<id>")
    return "ok", repr(result)


APP_OPERATIONS: dict[str, Callable[[App, str], Any]] = {
    "get": lambda app, rid: app.get_run(rid),
    "history": lambda app, rid: app.history(rid),
    "operations": lambda app, rid: app.operations(rid),
    "list": lambda app, rid: [r.run_id for r in app.list_runs(tenant="acme")],
    "cancel": lambda app, rid: app.cancel(rid),
    "kill": lambda app, rid: app.kill(rid),
    "kill_tenant": lambda app, rid: app.kill(tenant="acme"),
    "retry": lambda app, rid: app.retry(rid),
    "revive": lambda app, rid: app.revive(rid),
    "budget": lambda app, rid: app.set_budget(rid, Budget(tokens=1)),
    "resolve": lambda app, rid: app.resolve_operation(rid, 0, done=True),
    "resume": lambda app, rid: app.resume(rid),
}


def test_every_app_operation_on_another_tenants_run_is_no_such_run(deployment: Deployment) -> None:
    d = deployment
    _acme_world(d)
    d.acme.create_run(new_run("a2", tenant="acme"))
    d.acme.cancel_run("a2", "finished, for retry and revive")
    before = _snapshot(d)
    app = App(store=PostgresStore(d.urls["globex"], schema=SCHEMA, tenant="globex"))
    try:
        for name, operation in APP_OPERATIONS.items():
            for victim in ("a1", "a2"):
                theirs = _outcome(lambda: operation(app, victim), victim)  # noqa: B023 - called at once
                nobody = _outcome(lambda: operation(app, "no-such-run"), "no-such-run")  # noqa: B023
                assert theirs == nobody, name
                assert "acme" not in theirs[1] or name in ("list", "kill_tenant"), name

        @app.workflow
        def wf(ctx: Context, x: int) -> int:
            return x

        for start in (lambda: app.start(wf, 1, run_id="a1", tenant="globex"),
                      lambda: app.run(wf, 1, run_id="a1", tenant="globex")):
            with pytest.raises(InvalidRunState, match="already taken") as info:
                start()
            assert "acme" not in str(info.value)
    finally:
        app.close()
    assert _snapshot(d) == before


#: CLI commands on a run id, as another tenant's operator would type them.
CLI_COMMANDS = [
    ["show", "{id}"], ["show", "{id}", "--json"], ["events", "{id}"], ["cancel", "{id}"], ["retry", "{id}"],
    ["kill", "{id}"], ["resume", "{id}", "--force"], ["budget", "{id}", "--tokens", "5"],
    ["ops", "list", "{id}"], ["ops", "resolve", "{id}", "0", "--done", "1"],
]


def _cli_url(conninfo: str, tenant: str) -> str:
    """A ``postgresql://`` URL (what the CLI takes) for a libpq conninfo string."""
    params = conninfo_to_dict(conninfo)
    query = urlencode({"host": params.get("host", "localhost"), "port": params.get("port", "5432"),
                       "schema": SCHEMA, "tenant": tenant})
    return f"postgresql://{params['user']}@/{params['dbname']}?{query}"


def test_every_cli_command_on_another_tenants_run_is_no_such_run(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = deployment
    _acme_world(d)
    before = _snapshot(d)
    url = _cli_url(d.urls["globex"], "globex")
    monkeypatch.setenv("CAIRN_DB", url)
    runner = CliRunner()
    for command in CLI_COMMANDS:
        seen = []
        for run_id in ("a1", "no-such-run"):
            result = runner.invoke(main, [part.format(id=run_id) for part in command])
            seen.append((result.exit_code, result.output.replace(run_id, "<id>")))
        assert seen[0] == seen[1], command
        assert seen[0][0] != 0, command
        assert "no run with id" in seen[0][1], (command, seen[0][1])
        assert "acme" not in seen[0][1], command
    result = runner.invoke(main, ["runs", "--tenant", "acme"])
    assert result.exit_code == 0
    assert "a1" not in result.output
    assert _snapshot(d) == before
    forged = runner.invoke(main, ["--db", _cli_url(d.urls["globex"], "acme"), "runs"])
    assert forged.exit_code != 0
    assert "may not act for tenant 'acme'" in forged.output


def test_another_tenants_mailbox_is_no_such_run(deployment: Deployment) -> None:
    """Delivering to, or reading the mailbox of, another tenant's run answers
    exactly as for a run that does not exist, and stores nothing."""
    d = deployment
    _acme_world(d)
    before = d.as_role("owner", "SELECT * FROM mailbox ORDER BY run_id, seq")
    with pytest.raises(RunNotFound) as other:
        d.globex.deliver("a1", "signal:go", Payload(data=b"1"), dedupe="op-a")
    with pytest.raises(RunNotFound) as unknown:
        d.globex.deliver("nope", "signal:go", Payload(data=b"1"))
    assert str(other.value).replace("'a1'", "<id>") == str(unknown.value).replace("'nope'", "<id>")
    assert d.globex.deliveries("a1") == []
    assert d.as_role("owner", "SELECT * FROM mailbox ORDER BY run_id, seq") == before
    assert [m.seq for m in d.acme.deliveries("a1")] == [1, 2]


def test_a_scoped_store_sees_and_deletes_only_its_tenants_memory(deployment: Deployment) -> None:
    """Through the store API (as a tenant's worker or operator would), not raw SQL."""
    d = deployment
    _acme_world(d)
    assert {i.tenant for i in d.globex.memory_items(None)} == {"globex"}
    assert d.globex.memory_item("acme", ACME_NS, "pref") is None
    assert d.globex.thread_messages("acme", "th") == []
    assert d.globex.run_memory("a1") == []
    with pytest.raises(StoreError):  # the policy refuses a row of another tenant
        d.globex.write_memory("acme", [ItemPut(ACME_NS, "evil", Payload(data=b'"x"'))], Provenance(actor="g"))
    with pytest.raises(StoreError):  # and a provenance naming another tenant's run
        d.globex.write_memory("globex", [ItemPut(ACME_NS, "evil", Payload(data=b'"x"'))],
                              Provenance(run_id="a1", actor="g"))
    assert d.globex.delete_memory(MemoryScope("acme")) == 0
    assert d.globex.delete_memory(MemoryScope("globex", run_id="a1")) == 0
    before = len(d.owner.memory_items("acme"))
    assert before == 3  # the items of _acme_world's memory (one cold), and memory_world's
    [cold] = [i for i in d.acme.memory_items("acme") if i.tier == "cold"]
    assert d.globex.memory_item("acme", cold.namespace, cold.key) is None
    assert {i.tier for i in d.globex.memory_items(None)} == {"hot"}  # none of acme's cold values
    assert {u.tier for u in d.globex.item_tiers()} == {"hot"}
    assert d.globex.delete_memory(MemoryScope("globex")) == 3  # its own two items and its message
    assert len(d.owner.memory_items("acme")) == before
    assert d.acme.memory_item("acme", ACME_NS, "pref") is not None


# -- semantic memory (issue 14): the vector index under the policies -----------------------------

def memory_world(d: Deployment) -> None:
    """acme's item with its vector and a pending outbox row; a vector of globex's."""
    for tenant in ("acme", "globex"):
        d.as_role("owner", "INSERT INTO memory_items (tenant, namespace, key, metadata, index_text, "
                  "version, created_at, updated_at, accessed_at) "
                  "VALUES (%s, 'ns\x1f', 'k', '{}', 'secret', 1, 0, 0, 0)",
                  (tenant,))
        d.as_role("owner", "INSERT INTO memory_vectors (tenant, namespace, key, version, embedder, dims, "
                  "embedding, embedded_at) VALUES (%s, 'ns\x1f', 'k', 1, 'e', 2, %s, 0)",
                  (tenant, b"\x00\x00\x80?\x00\x00\x00\x00"))
    d.as_role("owner", "INSERT INTO memory_outbox (tenant, namespace, key, version, created_at) "
              "VALUES ('acme', 'ns\x1f', 'k', 2, 0)")


def test_search_and_the_embedding_worker_never_cross_tenants(vector_deployment: Deployment) -> None:
    from cairn.memory.embedders import HashEmbedder
    from cairn.memory.indexer import Indexer

    d = vector_deployment
    emb = HashEmbedder(32)
    for tenant in ("acme", "globex"):
        d.as_role("owner", "INSERT INTO memory_items (tenant, namespace, key, index_text, version, "
                  "created_at, updated_at, accessed_at) VALUES (%s, 'ns\x1f', %s, 'green tea', 1, 0, 0, 0)",
                  (tenant, f"{tenant}-tea"))
        d.as_role("owner", "INSERT INTO memory_outbox (tenant, namespace, key, version, created_at) "
                  "VALUES (%s, 'ns\x1f', %s, 1, 0)", (tenant, f"{tenant}-tea"))
    # globex's worker drains only globex's outbox: acme's row stays pending, unseen
    assert Indexer(d.globex, emb).drain() == 1
    query = emb.embed(["green tea"])[0]
    assert d.acme.search_memory("acme", "", query, 5, embedder=emb.name).unindexed == 1
    assert Indexer(d.acme, emb).drain() == 1
    mine = d.globex.search_memory("globex", "", query, 5, embedder=emb.name)
    assert [h.key for h in mine.hits] == ["globex-tea"]
    stolen = d.globex.search_memory("acme", "", query, 5, embedder=emb.name)
    assert (stolen.hits, stolen.unindexed) == ([], 0)
    assert d.as_role("globex", "SELECT key FROM memory_vectors WHERE tenant = 'acme'") == []
    # a forged store of acme's item by globex: no outbox row of acme's is claimed by it
    claim = d.acme.claim_embeddings("aw", 10, 30.0)
    assert claim.tasks == []
    [(before,)] = d.as_role("owner", "SELECT embedding FROM memory_vectors WHERE key = 'acme-tea'")
    from cairn.store.vectorindex import EmbeddingTask
    forged = EmbeddingTask("acme", "ns\x1f", "acme-tea", 1, "x", (1,), 1)
    assert d.globex.store_embeddings("any", emb.name, emb.dims, [(forged, [1.0] * emb.dims)]) == 0
    assert d.as_role("owner", "SELECT embedding FROM memory_vectors WHERE key = 'acme-tea'") == [(before,)]
    if d.owner.pgvector:  # pgvector's copy of the vector is under the same policy
        [(vec,)] = d.as_role("owner", "SELECT vec::text FROM memory_vectors WHERE key = 'acme-tea'")
        assert vec is not None
        theirs = d.as_role("globex", "SELECT key FROM memory_vectors WHERE vec IS NOT NULL")
        assert theirs == [("globex-tea",)]
        assert d.as_role("globex", "UPDATE memory_vectors SET vec = NULL WHERE tenant = 'acme'") == [(0,)]
        assert d.as_role("owner", "SELECT vec::text FROM memory_vectors WHERE key = 'acme-tea'") == [(vec,)]


# -- the token buckets of the installation's rates, as an attacker (issue 21) -------------------
#
# A tenant's role, with raw SQL, tries to refill (or reset) its own per-tenant
# bucket of the installation's tenant_rate, another tenant's, and the
# queue-wide one: by writing the rows, removing them (a missing row is a full
# bucket) and through the spending functions. {queue} and {tenant} name the
# row attacked ('' is the queue-wide bucket).
BUCKET_ATTACKS = [
    "UPDATE queue_buckets SET refilled_at = 0",  # refilled since 1970: full
    "UPDATE queue_buckets SET tokens = 1e9",
    "UPDATE queue_buckets SET tokens = 1e9, refilled_at = 1e12 "
    "WHERE queue = '{queue}' AND tenant = '{tenant}'",
    "DELETE FROM queue_buckets",
    "DELETE FROM queue_buckets WHERE queue = '{queue}' AND tenant = '{tenant}'",
    "TRUNCATE queue_buckets",
    "INSERT INTO queue_buckets VALUES ('{queue}', '{tenant}', 1e9, 1e12) "
    "ON CONFLICT (queue, tenant) DO UPDATE SET tokens = 1e9, refilled_at = 1e12",
    "SELECT spend_queue_tokens(ARRAY['{queue}'], ARRAY[-1000000000]::bigint[], 1e12)",
    "SELECT spend_tenant_tokens(ARRAY['{queue}'], ARRAY['{tenant}'], ARRAY[-1000000000]::bigint[], 1e12)",
    # its own running runs touched first, so this transaction counts as having moved them
    "UPDATE runs SET updated_at = updated_at WHERE status = 'running'; "
    "SELECT spend_tenant_tokens(ARRAY['{queue}'], ARRAY['{tenant}'], ARRAY[-1000000000]::bigint[], 1e12); "
    "SELECT spend_queue_tokens(ARRAY['{queue}'], ARRAY[-1000000000]::bigint[], 1e12)",
]


def _attack_buckets(d: Deployment) -> None:
    """Every attack of BUCKET_ATTACKS by both tenants' roles (under their own
    setting), on every bucket row of both rated queues; refusals ignored."""
    for key in ("acme", "globex"):
        for queue in ("q", "w"):
            for tenant in ("acme", "globex", ""):
                for attack in BUCKET_ATTACKS:
                    with contextlib.suppress(psycopg.Error):
                        d.as_role(key, attack.format(queue=queue, tenant=tenant))


def _claimed(*claims: list[Claim]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for batch in claims:
        for c in batch:
            counts[(c.run.queue, c.run.tenant)] = counts.get((c.run.queue, c.run.tenant), 0) + 1
    return counts


def test_a_tenant_role_cannot_refill_the_installations_rate_buckets(deployment: Deployment) -> None:
    """The installation's per-tenant rate of queue q (2 an hour) and the
    queue-wide rate of queue w (3 an hour) hold for claims made by the
    tenants' roles and by the installation's own, however a tenant's role
    wrote, removed or spent bucket rows with raw SQL before and between
    the claims (under a clock that stands still: no token comes back)."""
    d = deployment
    d.clock.now = time.time()  # the functions cap a claim's clock by the server's: keep the two together
    d.owner.set_queue(QueueLimits("q", tenant_rate=Rate(2, 3600)))
    d.owner.set_queue(QueueLimits("w", rate=Rate(3, 3600)))
    for tenant, store in (("acme", d.acme), ("globex", d.globex)):
        for queue in ("q", "w"):
            for i in range(4):
                store.create_run(new_run(f"{tenant}-{queue}{i}", tenant=tenant, queue=queue))
    _attack_buckets(d)  # before any claim: no bucket row exists yet
    first = _claimed(d.acme.claim_runs("aw", [WF], 20, 3600.0, 3),
                     d.globex.claim_runs("gw", [WF], 20, 3600.0, 3))
    assert first[("q", "acme")] == first[("q", "globex")] == 2
    assert first.get(("w", "acme"), 0) + first.get(("w", "globex"), 0) == 3
    _attack_buckets(d)  # now on the rows the claims wrote, with their runs running
    later = [store.claim_runs(worker, [WF], 20, 3600.0, 3)
             for store, worker in ((d.acme, "aw"), (d.globex, "gw"), (d.owner, "ow"))]
    assert _claimed(*later) == {}
    # spent, and refilled by no more than the seconds the server's clock moved
    # (a spending function refills up to the server's clock, never past it)
    rows = d.as_role("owner", "SELECT queue, tenant, tokens FROM queue_buckets ORDER BY queue, tenant")
    assert [(q, t) for q, t, _ in rows] == [("q", "acme"), ("q", "globex"), ("w", "")]
    assert all(0 <= tokens < 0.5 for _, _, tokens in rows), rows


def test_the_installations_tenant_rate_holds_and_refills_for_every_claimer(deployment: Deployment) -> None:
    """The normal claim path through spend_tenant_tokens: a tenant's role and
    the installation's own (which claims for every tenant) share one bucket
    per tenant, spend it exactly, and get tokens back as the clock moves."""
    d = deployment
    d.owner.set_queue(QueueLimits("q", tenant_rate=Rate(2, 3600)))
    for tenant, store in (("acme", d.acme), ("globex", d.globex)):
        for i in range(6):
            store.create_run(new_run(f"{tenant}-{i}", tenant=tenant, queue="q"))
    assert _claimed(d.acme.claim_runs("aw", [WF], 1, 3600.0, 3)) == {("q", "acme"): 1}
    assert _claimed(d.owner.claim_runs("ow", [WF], 20, 3600.0, 3)) == {("q", "acme"): 1, ("q", "globex"): 2}
    assert _claimed(*[store.claim_runs(worker, [WF], 20, 3600.0, 3)
                      for store, worker in ((d.acme, "aw"), (d.globex, "gw"), (d.owner, "ow"))]) == {}
    query = "SELECT tenant, tokens, refilled_at FROM queue_buckets ORDER BY tenant"
    assert d.as_role("owner", query) == [("acme", 0.0, d.clock.now), ("globex", 0.0, d.clock.now)]
    d.clock.advance(1800)  # one token back for each tenant
    assert _claimed(d.globex.claim_runs("gw", [WF], 20, 3600.0, 3)) == {("q", "globex"): 1}
    assert _claimed(d.owner.claim_runs("ow", [WF], 20, 3600.0, 3)) == {("q", "acme"): 1}
    assert d.as_role("owner", query) == [("acme", 0.0, d.clock.now), ("globex", 0.0, d.clock.now)]


def test_migration_25_takes_the_bucket_writes_back_from_roles_granted_before_it(pg_url: str) -> None:
    """A role granted a tenant under migration 24 could INSERT and UPDATE
    its buckets; after 25 it reads them only, and its raw writes fail."""
    role = f"cairn_rls_{os.getpid()}_{secrets.token_hex(3)}_old"
    schema = f"buckets_{secrets.token_hex(3)}"
    migrations = load_migrations("postgres")
    assert migrations[24].version == 25
    _admin(pg_url, sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(sql.Identifier(role)))
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema)))
            conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                         "applied_at DOUBLE PRECISION NOT NULL)")
            for migration in migrations[:24]:
                conn.execute(migration.sql.encode())
                conn.execute("INSERT INTO schema_migrations VALUES (%s, %s, 0)",
                             (migration.version, migration.name))
            conn.execute("SELECT grant_tenant(%s, 'acme')", (role,))
        table = f"{schema}.queue_buckets"

        def may(privilege: str) -> bool:
            return bool(_value(pg_url, "SELECT has_table_privilege(%s, %s, %s)", (role, table, privilege)))

        assert (may("INSERT"), may("UPDATE")) == (True, True)
        PostgresStore(pg_url, schema=schema).close()  # migrates the rest
        assert (may("SELECT"), may("INSERT"), may("UPDATE"), may("DELETE")) == (True, False, False, False)
        with (psycopg.connect(make_conninfo(pg_url, user=role), autocommit=True) as conn,
              pytest.raises(psycopg.errors.InsufficientPrivilege, match="queue_buckets")):
            conn.execute(sql.SQL("INSERT INTO {} VALUES ('q', 'acme', 1e9, 1e12)").format(
                sql.Identifier(schema, "queue_buckets")))
    finally:
        _admin(pg_url, sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)),
               sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)),
               sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _value(url: str, query: str, params: tuple[Any, ...]) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]


def test_a_scoped_store_stores_and_reads_only_its_tenants_workspace_objects(deployment: Deployment) -> None:
    """Workspace objects (migration 0030): a tenant's worker stores them for
    its own held run and reads its own; another tenant's identical object
    is a row of its own, and neither sees the other's, even by id."""
    d = deployment
    acme = running(d.acme, d.clock, "wa")
    globex = running(d.globex, d.clock, "wg")
    oid = "ab" * 32
    d.acme.put_workspace_objects("wa", acme.run.epoch, {oid: b"nacme's bytes"})
    assert d.acme.workspace_objects("acme", [oid]) == {oid: b"nacme's bytes"}
    assert d.globex.workspace_objects("acme", [oid]) == {}  # the policy hides another tenant's row
    assert d.globex.workspace_objects("globex", [oid]) == {}
    d.globex.put_workspace_objects("wg", globex.run.epoch, {oid: b"nglobex's bytes"})
    assert d.globex.workspace_objects("globex", [oid]) == {oid: b"nglobex's bytes"}
    assert d.acme.workspace_objects("acme", [oid]) == {oid: b"nacme's bytes"}
    d.clock.advance(60)  # storing it again moves its stored_at (0034: the collector's fence), own row only
    d.acme.put_workspace_objects("wa", acme.run.epoch, {oid: b"nacme's bytes"})
    assert d.acme.workspace_candidates("acme", d.clock() - 30) == []
    assert d.owner.workspace_candidates("globex", d.clock() - 30) == [oid]
    with pytest.raises(LeaseLost):  # another tenant's run is not one it can hold
        d.globex.put_workspace_objects("wa", acme.run.epoch, {"cd" * 32: b"nx"})
    assert d.owner.workspace_objects("acme", ["cd" * 32]) == {}


@pytest.mark.parametrize("attack", [
    "INSERT INTO api_tokens (token_id, tenant, role, name, digest, created_at) "
    "VALUES ('evil000000000002', 'globex', 'installation', 'evil', 'f', 0)",
    "UPDATE api_tokens SET role = 'installation' WHERE token_id = 'glob000000000001'",
    "INSERT INTO api_tokens (token_id, tenant, role, name, digest, created_at) "
    "VALUES ('glob000000000001', 'globex', 'viewer', 'again', 'f', 0) "
    "ON CONFLICT (token_id) DO UPDATE SET role = 'installation'",
    # the operator's installation token of globex, its secret replaced by one the tenant knows
    "UPDATE api_tokens SET digest = 'known', revoked_at = NULL WHERE role = 'installation'",
])
def test_a_tenant_role_cannot_mint_itself_an_installation_token(deployment: Deployment, attack: str) -> None:
    """``installation`` is the operator of the whole installation (queue-wide
    limits every tenant shares), above any tenant's ``admin``: a tenant's
    role that writes api_tokens with raw SQL, in its own tenant, must not be
    able to give itself that role, by a new row, an update, an upsert or a
    secret of its own on the operator's token. The owner (the installation's
    operator) still mints them."""
    deployment.as_role("owner", "INSERT INTO api_tokens (token_id, tenant, role, name, digest, created_at, "
                                "revoked_at) "
                                "VALUES ('inst000000000001', 'globex', 'installation', 'ops', 's', 0, 1)")
    deployment.as_role("globex", "INSERT INTO api_tokens (token_id, tenant, role, name, digest, created_at) "
                                 "VALUES ('glob000000000001', 'globex', 'admin', 'mine', 'f', 0)")
    before = deployment.as_role("owner", "SELECT * FROM api_tokens ORDER BY token_id")
    with pytest.raises(psycopg.Error, match="installation"):
        deployment.as_role("globex", attack)
    assert deployment.as_role("owner", "SELECT * FROM api_tokens ORDER BY token_id") == before
    assert [row[:3] for row in before] == [("glob000000000001", "globex", "admin"),
                                           ("inst000000000001", "globex", "installation")]


def test_a_tenant_cannot_count_a_collection_in_another_tenants_thread(deployment: Deployment) -> None:
    """A collection of a thread nobody holds makes its holder row (migration
    0053, owned by nobody): globex's role asking its store to count one in
    acme's thread is refused by row-level security, and acme's row keeps its
    count, where the row existed and where it did not."""
    from cairn.store.checkpointsql import NOBODY

    d = deployment
    count = {"tenant": "acme", "thread_id": "held"}
    d.acme._operate(lambda tx: d.acme._query(tx, "lg_count_collection", count))
    for thread in ("held", "unheld"):
        where = {"tenant": "acme", "thread_id": thread}
        with pytest.raises(StoreError):
            d.globex._operate(lambda tx, w=where: d.globex._query(tx, "lg_count_collection", w))
    rows = d.as_role("owner", "SELECT tenant, thread_id, owner, collected FROM lg_threads ORDER BY 2")
    assert rows == [("acme", "held", NOBODY, 1)]
