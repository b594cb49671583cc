"""The operator log (issue 26 items 1-2): every mutation of a token, a
queue's limits or a tenant's share, a schedule, a data key and a bundle is
recorded, with its actor and how it was authenticated, in the mutation's own
transaction (a refused one leaves none), no secret in it; the records chain
per tenant, ``audit verify`` names the first bad one (edit, delete, insert,
reorder, a forged actor; a cut tail through the anchor) and the signed
checkpoints cover them. On PostgreSQL a tenant's role reads and appends its
own tenant's records only, and can neither rewrite nor remove one."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import cairn
from cairn.api.keys import Keys
from cairn.api.tokens import Tokens
from cairn.cli.main import main as cli
from cairn.errors import InvalidArgument
from cairn.store import oplog
from cairn.store.admission import QueueLimits, QueueShare, Rate
from cairn.store.auditverify import Chains
from cairn.store.oplog import OperatorAction, chain_id
from cairn.worker.scheduler import Scheduler
from tests.encryption.test_sealed_store import Raw, build, keyring
from tests.store.test_postgres_rls import Deployment, deploy

ME = f"app:{os.getpid()}"


def records(app: cairn.App, **filters: Any) -> list[tuple[str, str, str, str, str, dict[str, Any]]]:
    """(tenant, kind, object, action, actor, change) of the log's operator records, in order."""
    return [(e.tenant, e.kind, e.object_id, e.event, e.actor, e.detail or {})
            for e in app.audit.log(**filters) if e.kind != "run"]


def test_python_paths_record_their_actor_in_the_mutations_transaction(place: str) -> None:
    app = build(place, keyring())
    minted = app.tokens.mint("acme", "admin", "ci-bot")
    assert Tokens(app.store, "user:ada").revoke(minted.record.token_id)
    assert not app.tokens.revoke(minted.record.token_id)  # revoked already: nothing changed, nothing recorded
    app.operator.set_queue(QueueLimits("mail", concurrency=2, tenant_rate=Rate(10, 60.0)))
    app.operator.set_queue_share(QueueShare("mail", "acme", concurrency=1))
    with pytest.raises(InvalidArgument):  # refused inside the transaction: no record either
        app.operator.set_queue_share(QueueShare("mail", "acme", rate=Rate(1000, 1.0)))
    app.start("canary", "x", tenant="acme")  # the tenant's first data key (no operator: not recorded)
    assert Keys(app.store, "user:ada").rotate("acme") == [("acme", 2)]
    app.schedule("0 * * * *", "canary", name="hourly", tenant="acme", kwargs={"text": "tick"})
    Scheduler(app.runtime, list(app.runtime.schedules.values()), worker_id="w7").register()
    Scheduler(app.runtime, list(app.runtime.schedules.values()), worker_id="w8").register()  # no change
    token_id = minted.record.token_id
    bundle = app.get_run(app.list_runs()[0].run_id).bundle
    [published] = records(app, kind="bundle")  # stored by the first start, as whoever started it
    assert published[:5] == ("acme", "bundle", bundle, "bundle.publish", ME)  # the starting tenant's log
    assert published[5]["workflow"] == "canary"
    assert [r for r in records(app) if r[1] != "bundle"] == [
        ("acme", "token", token_id, "token.mint", ME, {"name": "ci-bot", "role": "admin"}),
        ("acme", "token", token_id, "token.revoke", "user:ada", {}),
        ("", "queue", "mail", "queue.set", ME, {"name": "mail", "concurrency": 2, "tenant_concurrency": None,
                                                 "rate": None,
                                                 "tenant_rate": {"limit": 10, "period": 60.0,
                                                                 "burst": None}}),
        ("acme", "queue_share", "mail", "queue_share.set", ME,
         {"queue": "mail", "tenant": "acme", "concurrency": 1, "rate": None}),
        ("acme", "key", "acme", "key.rotate", "user:ada", {"version": 2, "kek_id": "kek1"}),
        ("acme", "schedule", "hourly", "schedule.register", "worker:w7",
         {"workflow": "canary", "cron": "0 * * * *", "timezone": "UTC", "missed": "once", "grace": 60.0,
          "created": True}),
    ]
    auth = {(e.event, e.auth) for e in app.audit.log(kind="token")}
    assert auth == {("token.mint", "in-process"), ("token.revoke", "configured")}
    assert [e.event for e in app.audit.log(event="queue")] == ["queue.set", "queue_share.set"]
    assert [e.event for e in app.audit.log(tenant="acme", actor="user:ada")] == ["token.revoke", "key.rotate"]
    # no secret anywhere in the log: the token's, the key's wrapped material
    dump = repr(Raw(place)("SELECT * FROM operator_log"))
    assert minted.secret.split("_", 2)[2] not in dump  # cairn_<id>_<secret> (the secret may hold '_')
    assert minted.record.digest not in dump
    wrapped = Raw(place)("SELECT wrapped FROM data_keys WHERE tenant = 'acme'")
    assert all(bytes(w).hex() not in dump and repr(bytes(w)) not in dump for (w,) in wrapped)
    report = app.audit.verify()
    assert report.problems == [], report.summary()
    assert report.operator_records == 7
    app.close()


def test_a_change_naming_a_secret_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/c.db")
    action = OperatorAction("acme", "token", "t1", "token.mint", ME, "in-process", {"meta": {"secret": "s"}})
    first = app.tokens.mint("acme", "viewer", "x").record
    second = dataclasses.replace(first, token_id="t1", name="y")
    with pytest.raises(ValueError, match=r"change\.meta\.secret"), app.store.acting(action):  # type: ignore[attr-defined]
        app.store.create_token(second)
    # the mint before it stays; the refused one is rolled back with its token row
    assert [r.name for r in app.tokens.list("acme")] == ["x"]
    assert [e.event for e in app.audit.log(kind="token")] == ["token.mint"]
    app.close()


def cli_run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_cli_paths_record_the_os_user_and_audit_log_filters_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAIRN_ACTOR", raising=False)
    db = f"sqlite:///{tmp_path}/c.db"
    cairn.App(db=db).close()
    code, out = cli_run("tokens", "mint", "deploy-bot", "--tenant", "acme", "--role", "operator", "--json",
                        "--db", db)
    assert code == 0, out
    minted = json.loads(out)
    assert cli_run("tokens", "revoke", minted["token_id"], "--db", db)[0] == 0
    assert cli_run("queues", "set", "mail", "--concurrency", "3", "--db", db)[0] == 0
    assert cli_run("queues", "share", "mail", "--tenant", "acme", "--concurrency", "1", "--db", db)[0] == 0
    assert cli_run("queues", "clear", "mail", "--db", db)[0] == 0
    code, out = cli_run("audit", "log", "--db", db, "--kind", "token", "--json")
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines()]
    me = f"cli:{pwd.getpwuid(os.getuid()).pw_name}@"
    assert [(e["event"], e["object_id"], e["auth"]) for e in lines] == [
        ("token.mint", minted["token_id"], "os-user"), ("token.revoke", minted["token_id"], "os-user")]
    assert all(e["actor"].startswith(me) and e["run_id"] == chain_id("acme") for e in lines)
    assert minted["token"] not in out
    code, out = cli_run("audit", "log", "--db", db, "--action", "queue")
    assert code == 0, out
    actions = [line.split()[6] for line in out.splitlines()]
    assert actions == ["queue.set", "queue_share.set", "queue.clear"], out
    assert "(installation)  queue mail (operator-log:#1)" in out
    code, out = cli_run("audit", "verify", "--db", db)
    assert code == 3, out
    assert "5 entries of 0 runs and operator logs (5 of the entries)" in out, out
    code, out = cli_run("start", "greet", "--app", "tests.cli.sample_app:app", "--db", db, "--input",
                        '{"name": "x"}')
    assert code == 0, out
    code, out = cli_run("audit", "log", "--db", db, "--kind", "bundle", "--json")
    [published] = [json.loads(line) for line in out.splitlines()]
    assert published["event"] == "bundle.publish"
    assert published["actor"].startswith(me)
    assert published["detail"]["workflow"] == "greet"


def test_the_chain_names_the_first_bad_record_and_the_anchor_catches_a_cut_tail(
        place: str, tmp_path: Path) -> None:
    app = cairn.App(db=place)
    tokens = [app.tokens.mint("acme", "viewer", f"bot-{i}").record.token_id for i in range(4)]
    app.operator.set_queue(QueueLimits("mail", concurrency=1))
    key, anchor = tmp_path / "audit.key", tmp_path / "anchor.jsonl"
    assert cli_run("audit", "keygen", str(key))[0] == 0
    code, out = cli_run("audit", "checkpoint", "--db", place, "--key", str(key), "--anchor", str(anchor))
    assert code == 0, out
    signed = [json.loads(line) for line in anchor.read_text().splitlines()]
    assert {r["tenant"]: r["heads"] for r in signed}["acme"][chain_id("acme")][0] == 4
    code, out = cli_run("audit", "verify", "--db", place, "--anchor", str(anchor), "--key", f"{key}.pub")
    assert code == 0, out
    assert out.startswith("VERIFIED"), out
    raw = Raw(place)
    kept = raw("SELECT * FROM operator_log WHERE tenant = 'acme' ORDER BY seq")

    def restore() -> None:
        raw("DELETE FROM operator_log WHERE tenant = 'acme'")
        raw.each("INSERT INTO operator_log VALUES (:a, :b, :c, :d, :e, :f, :g, :h, :i, :j, :k)",
                 [dict(zip("abcdefghijk", row, strict=True)) for row in kept])

    forged_link = bytes(32)
    tampers = {
        "forge the actor": ("UPDATE operator_log SET actor = 'user mallory' WHERE tenant = 'acme' "
                            "AND seq = 2", 2, "does not match its link"),
        "forge the auth": ("UPDATE operator_log SET auth = 'os-user' WHERE tenant = 'acme' AND seq = 3", 3,
                           "does not match its link"),
        "edit the change": ("UPDATE operator_log SET change = '{\"name\":\"bot-9\",\"role\":\"admin\"}' "
                            "WHERE tenant = 'acme' AND seq = 1", 1, "differs from the digest"),
        "edit the object": ("UPDATE operator_log SET object_id = 'x' WHERE tenant = 'acme' AND seq = 2", 2,
                            "does not match its link"),
        "delete": ("DELETE FROM operator_log WHERE tenant = 'acme' AND seq = 2", 2, "missing (deleted)"),
        "insert": ("INSERT INTO operator_log SELECT tenant, 5, at, kind, object_id, action, actor, auth, "
                   "change, digest, :forged FROM operator_log WHERE tenant = 'acme' AND seq = 4", 5,
                   "does not match its link"),
        "reorder": ("UPDATE operator_log SET seq = 107 - seq WHERE tenant = 'acme' AND seq IN (3, 4); "
                    "UPDATE operator_log SET seq = seq - 100 WHERE tenant = 'acme' AND seq > 100", 3,
                    "does not match its link"),
        "truncate": ("DELETE FROM operator_log WHERE tenant = 'acme' AND seq = 4", 4, "tail was cut"),
        "remove all": ("DELETE FROM operator_log WHERE tenant = 'acme'", None, "is gone"),
    }
    for name, (statement, seq, what) in tampers.items():
        for one in statement.split("; "):
            raw(one, **({"forged": forged_link} if ":forged" in one else {}))
        report = app.audit.verify(anchor=anchor)
        assert report.verdict.value == "TAMPERED", name
        first = report.problems[0]
        assert (first.run_id, first.seq) == (chain_id("acme"), seq), (name, first)
        assert what in first.what, (name, first.what)
        code, out = cli_run("audit", "verify", "--db", place, "--anchor", str(anchor))
        assert code == 4, (name, out)
        assert out.startswith(f"TAMPERED: run {chain_id('acme')!r}"), (name, out)
        restore()
    assert app.audit.verify(anchor=anchor).verdict.value == "VERIFIED"
    assert tokens  # every record was a real mint
    app.close()


@pytest.fixture
def deployment(pg_url: str) -> Any:
    with deploy(pg_url) as built:
        yield built


def test_a_tenant_role_appends_its_own_records_only_and_rewrites_none(deployment: Deployment) -> None:
    d = deployment
    minted = Tokens(d.acme, "http:acme-admin#1").mint("acme", "viewer", "bot")  # through the store, as acme
    Tokens(d.globex, "http:globex-admin#2").mint("globex", "viewer", "bot")
    assert [r[6] for r in d.acme.operator_log()] == ["http:acme-admin#1"]  # its own only
    assert [r[0] for r in d.owner.operator_log()] == ["acme", "globex"]
    for statement in ("UPDATE operator_log SET actor = 'x'", "DELETE FROM operator_log",
                      "TRUNCATE operator_log"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            d.as_role("acme", statement)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # row security: not another tenant's chain
        d.as_role("acme", "INSERT INTO operator_log SELECT 'globex', 2, at, kind, object_id, action, actor, "
                          "auth, change, digest, link FROM operator_log WHERE tenant = 'acme'")
    assert d.as_role("acme", "SELECT count(*) FROM operator_log WHERE tenant = 'globex'") == [(0,)]
    # a record appended behind the store's back, with a link it cannot compute right, fails verification
    d.as_role("acme", "INSERT INTO operator_log SELECT tenant, 2, at, kind, object_id, 'token.revoke', "
                      "actor, auth, change, digest, link FROM operator_log WHERE tenant = 'acme' AND seq = 1")
    chains = Chains()
    oplog.verify_into(chains, d.owner)
    assert [(p.run_id, p.seq) for p in chains.problems] == [(chain_id("acme"), 2)]
    assert chain_id("globex") in chains.heads
    assert minted.record.tenant == "acme"



def test_concurrent_operators_append_one_unbroken_chain(place: str) -> None:
    app = cairn.App(db=place)
    errors: list[BaseException] = []

    def mint(who: int) -> None:
        try:
            tokens = Tokens(app.store, f"user:op{who}")
            for i in range(8):
                tokens.mint("acme", "viewer", f"bot-{who}-{i}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=mint, args=(who,)) for who in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = list(app.store.operator_log(tenant="acme"))  # type: ignore[attr-defined]
    assert [r[1] for r in rows] == list(range(1, 33))
    chains = Chains()
    assert oplog.verify_into(chains, app.store) == 32
    assert chains.problems == []
    app.close()


def test_a_worker_records_the_bundles_it_stores_and_its_schedules(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/c.db")

    @app.workflow(name="nightly")
    def nightly(ctx: cairn.Context) -> int:
        return 1

    app.schedule("0 3 * * *", "nightly", name="at-three", tenant="acme")
    app.worker(worker_id="w1", poll_interval=0.02).run(install_signals=False, max_idle=0.2)
    app.worker(worker_id="w2", poll_interval=0.02).run(install_signals=False, max_idle=0.2)  # nothing new
    found = [(e.tenant, e.kind, e.event, e.actor, e.auth) for e in app.audit.log() if e.kind != "run"]
    assert sorted(found) == [("", "bundle", "bundle.publish", "worker:w1", "lease"),
                             ("acme", "schedule", "schedule.register", "worker:w1", "lease")]
    app.close()


def test_retention_policies_set_and_removed_are_recorded(place: str) -> None:
    app = cairn.App(db=place)
    app.operator.acting_as("user:ada").retention.set("model-bodies", "30d", tenant="acme")
    with pytest.raises(InvalidArgument):  # audit shorter than history: refused in the transaction, no record
        app.operator.retention.set("audit", "1d", tenant="acme")
    assert app.operator.retention.remove("model-bodies", tenant="acme")
    assert not app.operator.retention.remove("model-bodies", tenant="acme")  # none left: nothing recorded
    app.operator.retention.set("history", "1y")  # the installation's default
    found = [(e.tenant, e.object_id, e.event, e.actor, e.detail) for e in app.audit.log(kind="retention")]
    assert found == [
        ("acme", "*/model-bodies", "retention.set", "user:ada",
         {"tenant": "acme", "workflow": "*", "class": "model-bodies", "keep": 30 * 86400.0}),
        ("acme", "*/model-bodies", "retention.remove", ME,
         {"tenant": "acme", "workflow": "*", "class": "model-bodies"}),
        ("", "*/history", "retention.set", ME,
         {"tenant": "*", "workflow": "*", "class": "history", "keep": 365 * 86400.0}),
    ]
    assert app.audit.verify().problems == []
    app.close()
