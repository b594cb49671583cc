"""The operator log's coverage of keys, erasures and archives (issue 26):
a KEK rewrap, a re-encryption pass, an erasure (started and finished) and an
archive move or restore each append a record with its actor and how it was
authenticated, from Python and from the CLI (HTTP: tests/server/test_erasures.py),
on both backends; ``audit verify`` covers them, and an edit of one of them
(its actor above all) is TAMPERED, naming it."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import cairn
from cairn.api.keys import Keys
from cairn.cli.main import main as cli
from cairn.security.keyring import LocalKeyring, new_kek_line
from cairn.store.oplog import chain_id
from tests.audit.test_oplog import ME, records
from tests.encryption.test_sealed_store import Raw, build, drive


def tampered_at(app: cairn.App, place: str, tenant: str, action: str, statement: str) -> None:
    """Apply ``statement`` (``:seq``: the first record of ``action`` in
    ``tenant``'s log) to the database, check that ``audit verify`` names that
    record, and undo it."""
    (seq, actor, auth, change), *_ = Raw(place)(
        "SELECT seq, actor, auth, change FROM operator_log WHERE tenant = :tenant AND action = :action "
        "ORDER BY seq", tenant=tenant, action=action)
    assert app.audit.verify().problems == []
    Raw(place)(statement, tenant=tenant, seq=seq)
    report = app.audit.verify()
    assert report.verdict.value == "TAMPERED", (action, statement)
    first = report.problems[0]
    assert (first.run_id, first.seq) == (chain_id(tenant), seq), (action, first)
    Raw(place)("UPDATE operator_log SET actor = :actor, auth = :auth, change = :change "
               "WHERE tenant = :tenant AND seq = :seq", actor=actor, auth=auth, change=change, tenant=tenant,
               seq=seq)
    assert app.audit.verify().problems == []


FORGE_ACTOR = "UPDATE operator_log SET actor = 'mallory' WHERE tenant = :tenant AND seq = :seq"
FORGE_AUTH = "UPDATE operator_log SET auth = 'api-token' WHERE tenant = :tenant AND seq = :seq"
EDIT_CHANGE = ("UPDATE operator_log SET change = REPLACE(change, '\"', '\"x') "
               "WHERE tenant = :tenant AND seq = :seq")


def test_a_kek_rewrap_and_a_reencryption_record_their_actor_in_each_tenants_log(place: str) -> None:
    old = LocalKeyring.parse(new_kek_line("old"), "old key")
    app = build(place, old)
    app.start("canary", "x", tenant="acme")
    app.start("canary", "y")
    app.close()
    both = LocalKeyring({"old": old._kek("old"), "new": os.urandom(32)}, "new")  # the new KEK is current
    app = build(place, both)
    assert Keys(app.store, "user:ada").rewrap() == 2  # acme's and default's version 1
    assert Keys(app.store, "user:ada").rewrap() == 0  # nothing left to rewrap: nothing recorded
    assert Keys(app.store, "user:ada").rotate("acme") == [("acme", 2)]
    [moved] = Keys(app.store, "user:bo").reencrypt("acme")
    assert moved.moved > 0
    assert Keys(app.store, "user:bo").reencrypt("acme")[0].moved == 0  # a pass that moved nothing: none
    found = sorted(records(app, kind="key"), key=lambda r: (r[0], r[3]))
    assert found == [
        ("acme", "key", "acme", "key.reencrypt", "user:bo",
         {"newest": 2, "moved": moved.moved, "artifacts_moved": moved.artifacts_moved}),
        ("acme", "key", "acme", "key.rewrap", "user:ada",
         {"version": 1, "kek_id": "new", "old_kek_id": "old"}),
        ("acme", "key", "acme", "key.rotate", "user:ada", {"version": 2, "kek_id": "new"}),
        ("default", "key", "default", "key.rewrap", "user:ada",
         {"version": 1, "kek_id": "new", "old_kek_id": "old"}),
    ]
    assert {(e.event, e.auth) for e in app.audit.log(kind="key")} == {
        ("key.rewrap", "configured"), ("key.rotate", "configured"), ("key.reencrypt", "configured")}
    assert app.audit.verify().problems == []
    for statement in (FORGE_ACTOR, FORGE_AUTH, EDIT_CHANGE):
        tampered_at(app, place, "default", "key.rewrap", statement)
        tampered_at(app, place, "acme", "key.reencrypt", statement)
    app.close()


def test_cairn_keys_rotate_kek_and_reencrypt_record_the_cli_operator(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(new_kek_line("k1") + "\n")
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, LocalKeyring.from_file(keys))
    app.start("canary", "x", tenant="a")
    app.close()
    keys.write_text(keys.read_text() + new_kek_line("k2") + "\n")  # the last line's KEK is current
    runner = CliRunner(env={"CAIRN_ACTOR": "ops-ada", "CAIRN_KEYRING": ""})
    spec, ring = ["--db", url, "keys"], ["--keyring", f"file:{keys}"]
    done = runner.invoke(cli, [*spec, "rotate", "--kek", *ring])
    assert done.exit_code == 0, done.output
    assert "rewrapped 1 data keys" in done.output
    assert runner.invoke(cli, [*spec, "rotate", *ring, "--tenant", "a"]).exit_code == 0
    done = CliRunner(env={"CAIRN_ACTOR": None, "CAIRN_KEYRING": ""}).invoke(
        cli, [*spec, "reencrypt", *ring, "--tenant", "a"])
    assert done.exit_code == 0, done.output
    app = build(url, LocalKeyring.from_file(keys))
    found = {(r[3], r[4]) for r in records(app, kind="key")}
    me = f"cli:{pwd.getpwuid(os.getuid()).pw_name}@"
    assert ("key.rewrap", "user:ops-ada") in found
    assert ("key.rotate", "user:ops-ada") in found
    [(_, reencrypted_by)] = [r for r in found if r[0] == "key.reencrypt"]
    assert reencrypted_by.startswith(me)  # the OS user, without $CAIRN_ACTOR
    assert app.audit.verify().problems == []
    app.close()


def erasures_logged(app: cairn.App, tenant: str = "default") -> list[tuple[str, str, dict[str, Any]]]:
    return [(r[3], r[4], r[5]) for r in records(app, kind="erasure", tenant=tenant)]


def test_an_erasure_records_its_start_and_finish_with_its_actor_and_no_personal_data(place: str) -> None:
    app = build(place, None)
    app.start("canary", "x", subject="ada.lovelace@example.test")
    done = app.erase(subject="ada.lovelace@example.test")
    assert done.record is not None
    logged = erasures_logged(app)
    assert logged == [
        ("erasure.start", ME, {"scope": "subject", "target": done.record.digest}),
        ("erasure.finish", ME, {"counts": done.counts}),
    ]
    assert [e.object_id for e in app.audit.log(kind="erasure")] == [done.record.id] * 2
    assert "ada.lovelace" not in repr(Raw(place)("SELECT * FROM operator_log"))
    assert app.erase(subject="nobody", dry_run=True).record is None
    assert len(erasures_logged(app)) == 2  # a dry run records nothing
    for statement in (FORGE_ACTOR, FORGE_AUTH, EDIT_CHANGE):
        tampered_at(app, place, "default", "erasure.start", statement)
        tampered_at(app, place, "default", "erasure.finish", statement)
    app.close()


def test_cairn_erase_records_the_cli_operator_in_the_tenants_log(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, None)
    app.start("canary", "x", tenant="acme", subject="frank")
    app.close()
    done = CliRunner(env={"CAIRN_ACTOR": "ops-ada"}).invoke(
        cli, ["erase", "--subject", "frank", "--tenant", "acme", "--db", url])
    assert done.exit_code == 0, done.output
    app = build(url, None)
    assert [(a, who) for a, who, _ in erasures_logged(app, "acme")] == [
        ("erasure.start", "user:ops-ada"), ("erasure.finish", "user:ops-ada")]
    assert {e.auth for e in app.audit.log(kind="erasure")} == {"configured"}
    assert app.audit.verify().problems == []
    app.close()


def test_archive_moves_record_their_actor_and_the_archives_digest(place: str) -> None:
    app = build(place, None)
    run_id = app.start("canary", "one", tenant="acme").run_id
    drive(app, run_id, "ok")
    record = app.operator.acting_as("user:ada").archive_run(run_id)
    app.operator.acting_as("user:bo").restore(run_id)
    app.store.archive_run(run_id)  # no operator named: the system's move
    moves = records(app, kind="archive")
    change = {"ref": record.ref, "entries": record.entries, "last_seq": record.last_seq,
              "head": None if record.last_link is None else record.last_link.hex(),
              "stored_bytes": record.stored_bytes}
    assert moves[:2] == [("acme", "archive", run_id, "archive.move", "user:ada", change),
                         ("acme", "archive", run_id, "archive.restore", "user:bo", change)]
    assert moves[2][3:5] == ("archive.move", "system:store")
    assert [e.auth for e in app.audit.log(kind="archive")] == ["configured", "configured", "system"]
    assert record.last_link is not None
    assert len(record.last_link) in (32, 33)  # a link of version 1 or 2 (auditlinks.link_version)
    for statement in (FORGE_ACTOR, FORGE_AUTH, EDIT_CHANGE):
        tampered_at(app, place, "acme", "archive.move", statement)
        tampered_at(app, place, "acme", "archive.restore", statement)
    app.close()


def test_cairn_archive_run_and_restore_record_the_cli_operator(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    app = build(url, None)
    run_id = app.start("canary", "one").run_id
    drive(app, run_id, "ok")
    runner = CliRunner(env={"CAIRN_ACTOR": "ops-ada"})
    done = runner.invoke(cli, ["--db", url, "archive", "run", "--older-than", "0s"])
    assert done.exit_code == 0, done.output
    done = CliRunner(env={"CAIRN_ACTOR": None}).invoke(cli, ["--db", url, "archive", "restore", run_id])
    assert done.exit_code == 0, done.output
    me = f"cli:{pwd.getpwuid(os.getuid()).pw_name}@"
    moves = [(r[3], r[4]) for r in records(app, kind="archive")]
    assert moves[0] == ("archive.move", "user:ops-ada")
    assert moves[1][0] == "archive.restore"
    assert moves[1][1].startswith(me)
    assert app.audit.verify().problems == []
    app.close()
