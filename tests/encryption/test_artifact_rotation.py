"""Artifacts under rotation (issue 25): a re-encryption pass moves a
tenant's artifacts to its newest key in place, at addresses that survive it
(``cairn.store.sealedartifacts``), so no row naming one changes and the
audit chain still verifies; those stored before addresses (named by the
hash of their sealed bytes) move too. Bytes moved under another name are
refused; a pass never overwrites an artifact changed or collected since it
read it; on PostgreSQL a tenant's role can add an artifact under a name but
never rewrite one."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.api.keys import Keys
from cairn.errors import PayloadError, StoreError
from cairn.security.envelope import SealError, seal, synthetic_nonce
from cairn.store.auditverify import verify_store
from cairn.store.rekey import version_of
from cairn.store.sealedartifacts import is_legacy, legacy_place
from tests.encryption.test_sealed_store import CANARY, Raw, build, drive, keyring
from tests.engine.conftest import execute_once

#: every column that names an artifact
REF_COLUMNS = (("runs", "input_ref"), ("runs", "result_ref"), ("history", "payload_ref"),
               ("mailbox", "payload_ref"), ("memory_items", "value_ref"), ("memory_run", "value_ref"),
               ("memory_thread_messages", "value_ref"))


def legacy_put(store: Any) -> Callable[[str, bytes], str]:
    """How the release before addresses stored a tenant's artifact: sealed at
    ``(tenant, "-", "artifacts", "-", "data")``, named by the SHA-256 of the
    sealed bytes (a database written by it, for the pass to move)."""

    def put(tenant: str, data: bytes) -> str:
        version, cipher = store.keys.writer(tenant)
        place = legacy_place(tenant)
        nonce = synthetic_nonce(store.keys.nonce_key(tenant, version), place, data)
        ref: str = store.inner.put_artifact(seal(cipher, version, place, data, nonce))
        return ref

    return put


def refs(place: str, tenant: str) -> set[str]:
    raw = Raw(place)
    return {r for table, column in REF_COLUMNS
            for (r,) in raw(f"SELECT {column} FROM {table} WHERE tenant = :t AND {column} IS NOT NULL",
                            t=tenant)}


def stored(place: str, ref: str) -> bytes:
    if place.startswith("sqlite"):
        return artifact_file(place, ref).read_bytes()
    return bytes(Raw(place)("SELECT data FROM artifacts WHERE ref = :ref", ref=ref)[0][0])


def artifact_file(place: str, ref: str) -> Path:
    path = Path(place.removeprefix("sqlite:///"))
    return path.with_name(path.name + ".artifacts") / ref[:2] / ref


def overwrite(place: str, ref: str, data: bytes) -> None:
    """Bytes put under ``ref`` behind the store's back (an attacker with write access)."""
    if place.startswith("sqlite"):
        artifact_file(place, ref).write_bytes(data)
    else:
        Raw(place)("UPDATE artifacts SET data = :data WHERE ref = :ref", data=data, ref=ref)


def contents(app: cairn.App, tenant: str, names: set[str]) -> dict[str, bytes]:
    return {ref: app.store.artifacts.open(tenant, ref, app.store.inner.read_artifact(ref)) for ref in names}


@pytest.fixture
def mixed(place: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[cairn.App, dict[str, str]]]:
    """Tenant a's artifacts stored both ways (before addresses, and at them),
    tenant b's at addresses; run ``waiting`` suspended at its signal, its
    large step result an artifact stored before addresses."""
    app = build(place, keyring())
    store: Any = app.store
    with monkeypatch.context() as patch:
        patch.setattr(store.artifacts, "put", legacy_put(store))
        runs = {"old": app.start("canary", f"{CANARY}-old", tenant="a").run_id,
                "waiting": app.start("canary", f"{CANARY}-waiting", tenant="a").run_id}
        assert drive(app, runs["old"], "ok") == "completed"
        assert execute_once(app, runs["waiting"]) == "suspended"
    runs["new"] = app.start("canary", f"{CANARY}-new " + "n" * 2000, tenant="a").run_id  # input: an artifact
    assert drive(app, runs["new"], "ok") == "completed"
    runs["b"] = app.start("canary", f"{CANARY}-b", tenant="b").run_id
    assert drive(app, runs["b"], "ok") == "completed"
    yield app, runs
    app.close()


def test_a_pass_moves_artifacts_in_place_and_the_chain_and_replay_are_unchanged(
        place: str, mixed: tuple[cairn.App, dict[str, str]]) -> None:
    app, runs = mixed
    store: Any = app.store
    names = refs(place, "a")
    legacy = {r for r in names if is_legacy(r, stored(place, r))}
    assert legacy, "both kinds of artifact are needed for the test to prove anything"
    assert names - legacy
    before = contents(app, "a", names)
    chain = "SELECT run_id, seq, payload_ref, digest, link FROM history ORDER BY run_id, seq"
    links = Raw(place)(chain)
    assert verify_store(store).problems == []
    b_bytes = {r: stored(place, r) for r in refs(place, "b")}

    assert store.rotate("a") == 2
    status = store.key_status("a")
    assert status.old_artifacts == status.artifacts[1] == len(names)
    done = store.reencrypt("a", page=2)  # small pages: the cursor crosses several
    assert (done.artifacts_moved, done.artifacts_raced) == (len(names), 0)
    status = store.key_status("a")
    assert status.old_artifacts == 0
    assert dict(status.artifacts) == {2: len(names)}
    assert {version_of(stored(place, r)) for r in names} == {2}  # 0 artifacts left on the retired key
    assert refs(place, "a") == names  # no row renamed: the names survived
    assert not any(is_legacy(r, stored(place, r)) for r in names)  # all sealed at their names now
    assert contents(app, "a", names) == before
    assert Raw(place)(chain) == links
    assert verify_store(store).problems == []  # cairn audit verify: every link as it was
    assert {r: stored(place, r) for r in refs(place, "b")} == b_bytes  # another tenant's: untouched
    assert store.reencrypt("a").artifacts_moved == 0  # nothing left: a second pass writes nothing

    app.signal(runs["waiting"], "go", f"{CANARY}-after")  # replay reads its moved step result
    assert execute_once(app, runs["waiting"]) == "suspended"
    (request,) = app.approvals(run_id=runs["waiting"])
    app.approve(runs["waiting"], request.request_id)
    assert execute_once(app, runs["waiting"]) == "completed"
    result = app.store.get_run(runs["waiting"]).result
    large = app.runtime.payloads.load(result, what="the result")["large"]
    assert large == (f"{CANARY}-waiting {CANARY}-artifact " + "z" * 2000)[:40]  # the step's, replayed
    assert verify_store(store).problems == []
    assert not [f for r in Keys(store).verify("a") for f in r.failures]


def test_moved_artifacts_are_bound_to_their_names(place: str,
                                                  mixed: tuple[cairn.App, dict[str, str]]) -> None:
    """After the move no name is a hash of its bytes any more: what binds
    them is the envelope. Another artifact's bytes (of the same tenant, or
    another's) put under a name are refused, naming the place."""
    app, _ = mixed
    store: Any = app.store
    legacy = sorted(r for r in refs(place, "a") if is_legacy(r, stored(place, r)))
    addressed = sorted(r for r in refs(place, "a") if r not in legacy)
    store.rotate("a")
    store.reencrypt("a")
    other = sorted(refs(place, "b"))[0]
    for victim, source in ((legacy[0], addressed[0]), (addressed[0], legacy[0]), (addressed[0], other)):
        kept = stored(place, victim)
        overwrite(place, victim, stored(place, source))
        with pytest.raises(SealError) as caught:
            store.get_artifact(victim)
        assert f"artifacts.data at {victim}" in str(caught.value) or "another tenant" in str(caught.value)
        (report,) = Keys(store).verify("a")
        assert any(victim in failure for failure in report.failures), report.failures
        overwrite(place, victim, kept)
        assert store.get_artifact(victim)


def test_a_pass_never_overwrites_an_artifact_changed_or_collected_since_it_read_it(
        place: str, mixed: tuple[cairn.App, dict[str, str]]) -> None:
    app, _ = mixed
    store: Any = app.store
    name = sorted(refs(place, "a"))[0]
    read = stored(place, name)
    assert store.inner.replace_artifact(name, read + b"stale", b"resealed") is False
    assert stored(place, name) == read
    assert store.inner.replace_artifact(name, read, read + b"!") is True  # the compare-and-set's other half
    assert stored(place, name) == read + b"!"
    gone = hashlib.sha256(b"never stored").hexdigest()
    assert store.inner.replace_artifact(gone, b"", b"x") is False  # collected: nothing written back
    with pytest.raises(PayloadError, match="missing"):
        store.inner.read_artifact(gone)
    with pytest.raises(PayloadError, match="malformed"):
        store.inner.put_artifact_at("../escape", b"x")


def test_a_pass_moves_workspace_objects_in_place_too(place: str) -> None:
    """Workspace objects (at addresses already, ``store.wssealed``): sealed
    again at theirs, compare-and-set; they read back the same, and another
    tenant's stay on its key."""
    app = build(place, keyring())
    store: Any = app.store
    objects = {t: {hashlib.sha256(f"{t}{i}".encode()).hexdigest(): os.urandom(300) for i in range(5)}
               for t in ("a", "b")}
    for tenant, held in objects.items():
        run_id = app.start("canary", f"{CANARY}-ws", tenant=tenant).run_id
        claim = store.claim_run(run_id, "w1", 30.0, 0)
        store.put_workspace_objects(run_id, claim.run.epoch, held)
    raw = Raw(place)

    def ws_versions(tenant: str) -> list[int | None]:
        rows = raw("SELECT data FROM workspace_objects WHERE tenant = :t", t=tenant)
        return sorted(version_of(bytes(d)) for (d,) in rows)

    assert ws_versions("a") == [1] * 5
    store.rotate("a")
    assert store.key_status("a").old >= 5
    store.reencrypt("a", page=2)
    assert ws_versions("a") == [2] * 5  # 0 objects left on the retired key
    assert ws_versions("b") == [1] * 5
    for tenant, held in objects.items():
        assert store.workspace_objects(tenant, list(held)) == held
    (row,) = raw("SELECT oid, data FROM workspace_objects WHERE tenant = 'a' ORDER BY oid LIMIT 1")
    stale = {"tenant": "a", "oid": row[0], "data": b"resealed", "old_data": bytes(row[1]) + b"x"}
    assert store.inner.rekey_set("rekey_ws_set", stale) is False  # changed since read: left as it is
    app.close()


def test_cairn_keys_status_and_reencrypt_report_artifacts(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from cairn.cli.main import main as cli
    from cairn.security.keyring import LocalKeyring, new_kek_line

    monkeypatch.setenv("CAIRN_KEYRING", "")
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, LocalKeyring.from_file(keys))
    drive(app, app.start("canary", f"{CANARY}-cli", tenant="a").run_id, "ok")
    app.close()
    spec, ring = ["--db", url, "keys"], ["--keyring", f"file:{keys}"]
    runner = CliRunner()
    assert runner.invoke(cli, [*spec, "rotate", *ring]).exit_code == 0
    done = runner.invoke(cli, [*spec, "status", *ring])
    assert "artifacts v1: 1; 1 on older keys" in done.output, done.output
    done = runner.invoke(cli, [*spec, "reencrypt", *ring])
    assert "(1 of them artifacts)" in done.output, done.output
    done = runner.invoke(cli, [*spec, "status", *ring])
    assert "artifacts v2: 1; 0 on older keys" in done.output, done.output
    done = runner.invoke(cli, [*spec, "verify", *ring])
    assert done.exit_code == 0, done.output
    assert "1 artifacts, 0 failures" in done.output, done.output
    for path in (tmp_path / "c.db.artifacts").rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            path.write_bytes(path.read_bytes()[:-1] + bytes([path.read_bytes()[-1] ^ 1]))  # damaged
    done = runner.invoke(cli, [*spec, "verify", *ring])
    assert done.exit_code == 1, done.output
    assert "does not decrypt" in done.output, done.output


def test_a_tenants_role_adds_artifacts_under_names_but_never_rewrites_one(pg_url: str) -> None:
    """The hostile tenant (its own PostgreSQL role) knows the name of acme's
    artifact: storing other bytes under it keeps acme's, through the store or
    the function directly; rewriting one is refused to every tenant's role."""
    from tests.store.test_postgres_rls import deploy

    with deploy(pg_url) as d:
        name = hashlib.sha256(b"acme's address").hexdigest()
        sealed = os.urandom(3000)
        d.acme.put_artifact_at(name, sealed)
        d.globex.put_artifact_at(name, b"evil")
        d.as_role("globex", "SELECT store_artifact_at(%s, 'evil'::bytea, 0)", (name,))
        assert d.owner.read_artifact(name) == sealed
        for role in (d.globex, d.acme):
            with pytest.raises(StoreError, match="owner's role"):
                role.replace_artifact(name, sealed, b"evil")
        with pytest.raises(Exception, match="malformed artifact name"):
            d.as_role("globex", "SELECT store_artifact_at('../x', 'evil'::bytea, 0)")
        assert d.owner.replace_artifact(name, sealed, b"resealed") is True
        assert d.owner.read_artifact(name) == b"resealed"
