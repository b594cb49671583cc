"""Erasure by subject (issue 26, ``cairn.api.erasure``) on SQLite and PostgreSQL.

A canary string of subject A and one of subject B go through everything a
run stores (its input, as an artifact too; its journal; a large step result,
an artifact; its result; long-term memory with the text to embed, cooled to
the cold tier; run memory; a thread message). Erasing A leaves 0 occurrences
of A's canary and of A's subject id in every byte at rest (the SQLite file,
WAL and artifacts; a ``pg_dump`` of the PostgreSQL database), in every form
(raw, hex, base64 at each alignment, UTF-16, inside zlib streams), while B
reads back whole. Without encryption the scan finds B's canary (the control:
the scan sees what it looks for). With encryption a copy of the database
taken before the erasure, opened with the current keyring, refuses A's
values with a clear error and reads B's.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cairn
from cairn.api.audit import Verdict
from cairn.api.auditanchor import generate_key
from cairn.api.erasure import Target, erase
from cairn.errors import InvalidArgument, StoreError
from cairn.security.envelope import SealError
from cairn.security.keyring import LocalKeyring
from cairn.security.shredding import FileShredder
from cairn.store import sealing
from cairn.store.sealing import KeyErased
from tests import processes
from tests.encryption.test_sealed_store import forms, inflated, rows_at_rest
from tests.engine.conftest import execute_once, postgres_url
from tests.store.contract.helpers import new_run
from tests.store.test_postgres_rls import Deployment, deployment  # noqa: F401 - the fixture

CANARY = {"A": "Kq3aliceCanaryV8", "B": "Kq3bobCanaryV8"}
SUBJECT = {"A": "alice.subject@example.test", "B": "bob.subject@example.test"}


def occurrences(blob: bytes, value: str) -> int:
    found = sum(blob.count(form) for form in forms(value))
    return found + sum(1 for out in inflated(blob) if any(form in out for form in forms(value)))


def keyring(directory: Path) -> LocalKeyring:
    return LocalKeyring({"kek1": os.urandom(32)}, "kek1", FileShredder(directory / "subjects"))


def build(url: str, ring: LocalKeyring | None) -> cairn.App:
    app = cairn.App(db=url, keyring=ring, lease_seconds=5.0, inline_limit=1024)

    @app.step()
    def shout(text: str) -> str:
        return f"{text} step"

    @app.step()
    def big(text: str) -> str:
        return f"{text} artifact " + "z" * 3000

    @app.workflow(name="subjectwork")
    def work(ctx: cairn.Context, who: str, text: str) -> dict[str, Any]:
        loud = shout(text[:40])
        large = big(text[:40])
        ctx.memory.put(("people",), who, f"{text[:40]} memory " + "m" * 300, index=f"{text[:40]} index")
        ctx.memory.run.put("scratch", f"{text[:40]} run-memory")
        ctx.memory.thread(f"thread-{who}").append(f"{text[:40]} thread")
        return {"loud": loud, "large": large[:60], "tail": f"{text[:40]} result"}

    return app


def start_both(app: cairn.App) -> dict[str, str]:
    runs = {}
    for who in ("A", "B"):
        text = f"{CANARY[who]} input " + "y" * 2000  # an input large enough to be an artifact
        runs[who] = app.start("subjectwork", who, text, subject=SUBJECT[who]).run_id
        assert execute_once(app, runs[who]) == "completed"
    now = app.store.clock
    app.store.clock = lambda: now() + 3600.0  # nobody read them for an hour: their values go cold
    try:
        assert app.store.tier_items(60.0).cooled == 2  # the cold tier (compressed)
    finally:
        app.store.clock = now
    return runs


def assert_b_whole(app: cairn.App, run_b: str) -> None:
    result = app.handle(run_b).result(timeout=5)
    assert result["tail"].startswith(CANARY["B"])
    assert CANARY["B"] in result["large"]
    item = app.operator.memory("default").get(("people",), "B")
    assert item is not None
    assert item.value.startswith(CANARY["B"])
    steps = [e for e in app.history(run_b) if e.name == "shout" and e.payload is not None]
    assert steps, "the journal records the step"
    assert all(CANARY["B"].encode() in (e.payload.data or b"") for e in steps)  # the journal reads back


@pytest.mark.parametrize(("backend", "sealed"), [
    ("sqlite", False), ("sqlite", True),
    pytest.param("postgres", False, marks=pytest.mark.slow),  # pg_dump is a process
    pytest.param("postgres", True, marks=pytest.mark.slow),
], ids=["sqlite-plain", "sqlite-sealed", "postgres-plain", "postgres-sealed"])
def test_an_erased_subjects_canary_is_nowhere_at_rest_and_the_others_reads_back(
        backend: str, sealed: bool, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if backend == "postgres":
        url = postgres_url(request.getfixturevalue("pg_url"))
    else:
        (tmp_path / "db").mkdir()
        url = f"sqlite:///{tmp_path}/db/cairn.db"
    app = build(url, keyring(tmp_path) if sealed else None)
    if backend == "sqlite":  # as a SQLite built without SECURE_DELETE (Debian's has it on): deleted
        app.store._writer_conn().execute("PRAGMA secure_delete = OFF")  # cells keep their bytes until VACUUM
    try:
        runs = start_both(app)
        before = rows_at_rest(url)
        if not sealed:  # the control: the scan finds what is there
            assert occurrences(before, CANARY["A"])
            assert occurrences(before, SUBJECT["A"])

        done = app.erase(subject=SUBJECT["A"])

        assert done.counts == {"runs": 1, "killed": 0, "memory": 2, "keys": 1 if sealed else 0}
        after = rows_at_rest(url)
        assert occurrences(after, CANARY["A"]) == 0
        assert occurrences(after, SUBJECT["A"]) == 0  # the subject id is personal data too
        if not sealed:
            assert occurrences(after, CANARY["B"]) > 0
        assert_b_whole(app, runs["B"])
        with pytest.raises(cairn.RunNotFound):
            app.get_run(runs["A"])
        assert app.operator.memory("default").get(("people",), "A") is None
        assert app.store.thread_messages("default", "thread-A") == []
        assert app.audit.verify().verdict is not Verdict.TAMPERED
    finally:
        app.close()


def test_a_backup_taken_before_the_erasure_cannot_decrypt_the_erased_subject(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    url = f"sqlite:///{tmp_path}/db/cairn.db"
    ring = keyring(tmp_path)
    app = build(url, ring)
    runs = start_both(app)
    with sqlite3.connect(tmp_path / "db" / "cairn.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    shutil.copytree(tmp_path / "db", tmp_path / "backup")
    app.erase(subject=SUBJECT["A"])
    app.close()

    restored = build(f"sqlite:///{tmp_path}/backup/cairn.db", ring)  # the current keyring
    try:
        with pytest.raises(KeyErased, match=r"subject that was erased \(data key \d+, crypto-shredded\)"):
            restored.get_run(runs["A"])
        with pytest.raises(SealError, match="erased"):
            restored.operator.memory("default").get(("people",), "A")
        assert_b_whole(restored, runs["B"])
    finally:
        restored.close()
    # the keyring's subject file holds B's secret only: A's is gone, not hidden
    assert len((tmp_path / "subjects").read_text().splitlines()) == 1


def test_the_erasure_record_holds_no_personal_data_and_names_its_actor(tmp_path: Path) -> None:
    app = build(f"sqlite:///{tmp_path}/cairn.db", keyring(tmp_path))
    try:
        start_both(app)
        planned = app.erase(subject=SUBJECT["A"], dry_run=True)
        assert planned.counts == {"runs": 1, "killed": 0, "memory": 2, "keys": 1}
        assert planned.record is None
        assert app.operator.erasures() == []  # a dry run records nothing
        done = app.erase(subject=SUBJECT["A"])
        (record,) = app.operator.erasures()
        assert record == done.record
        assert record.finished_at is not None
        assert record.actor == app.operator.actor
        assert record.scope == "subject"
        text = str(record.as_dict())
        assert SUBJECT["A"] not in text
        assert CANARY["A"] not in text
        # keyed: the digest is not the plain hash anyone could compute from a guessed id
        from cairn.store.erasuresql import plain_digest
        assert record.digest != plain_digest("default", "subject", SUBJECT["A"])
        assert app.erase(subject=SUBJECT["A"]).counts == {"runs": 0, "killed": 0, "memory": 0, "keys": 0}
    finally:
        app.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_subjects_live_runs_are_killed_and_its_children_go_with_it(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = (postgres_url(request.getfixturevalue("pg_url")) if backend == "postgres"
           else f"sqlite:///{tmp_path}/cairn.db")
    app = cairn.App(db=url, lease_seconds=5.0)

    @app.workflow(name="leaf")
    def leaf(ctx: cairn.Context) -> str:
        ctx.memory.put(("notes",), ctx.run_id, "child memory")
        return "leaf"

    @app.workflow(name="parent")
    def parent(ctx: cairn.Context) -> str:
        ctx.start_child(leaf)
        return str(ctx.wait_for_signal("go"))

    try:
        root = app.start("parent", subject="carol", thread_id="t-1").run_id
        other = app.start("parent", subject="dave").run_id
        assert execute_once(app, root) == "suspended"
        (child,) = [r.run_id for r in app.list_runs() if r.parent_run_id == root]
        assert app.store.run_subject(child) == "carol"  # inherited
        assert execute_once(app, child) == "completed"
        (_item,) = app.store.memory_items("default", run_id=child)
        done = app.erase(subject="carol")
        assert done.counts == {"runs": 2, "killed": 1, "memory": 1, "keys": 0}
        assert {r.run_id for r in app.list_runs()} == {other}
        assert app.store.memory_items("default") == []
        with pytest.raises(InvalidArgument, match="control characters"):
            app.start("parent", subject="bad\nsubject")
        assert app.erase(thread="t-1").counts["runs"] == 0  # the thread's runs went with carol
    finally:
        app.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_runs_subject_never_changes(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if backend == "postgres":
        conninfo = request.getfixturevalue("pg_url")
        app = cairn.App(db=postgres_url(conninfo), lease_seconds=5.0)
        app.store.create_run(new_run("r1", subject="erin"))
        with psycopg.connect(conninfo, autocommit=True) as conn, pytest.raises(psycopg.Error, match="never"):
            conn.execute("UPDATE cairn.runs SET subject = 'mallory' WHERE run_id = 'r1'")
    else:
        app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db", lease_seconds=5.0)
        app.store.create_run(new_run("r1", subject="erin"))
        with sqlite3.connect(tmp_path / "cairn.db") as conn, pytest.raises(sqlite3.Error, match="never"):
            conn.execute("UPDATE runs SET subject = NULL WHERE run_id = 'r1'")
    assert app.store.run_subject("r1") == "erin"
    app.close()


def test_a_tenants_role_cannot_erase_nor_shred_another_tenants_subject(
        deployment: Deployment) -> None:  # noqa: F811 - the fixture
    d = deployment
    d.owner.create_run(new_run("g1", tenant="globex", subject="victim"))
    d.owner.add_data_key(_key_row("globex"))
    with pytest.raises(StoreError):
        erase(d.acme, Target("globex", subject="victim"), actor="acme-role")
    assert d.owner.run_subject("g1") == "victim"
    assert d.owner.erasures() == []
    # raw SQL as acme's role: no tenant's role may shred (or forge a tombstone of) any key
    for tenant in ("globex", "acme"):
        with pytest.raises(psycopg.Error, match="permission denied"):
            d.as_role("acme", f"UPDATE data_keys SET kek_id = 'erased' WHERE tenant = '{tenant}'")
    assert d.as_role("acme", "SELECT count(*) FROM data_keys WHERE tenant = 'globex'") == [(0,)]  # unseen
    with pytest.raises(psycopg.Error, match="permission denied"):
        d.as_role("acme", "SELECT * FROM erasures")
    assert [r.kek_id for r in d.owner.data_keys("globex")] == ["k"]


def _key_row(tenant: str) -> Any:
    from cairn.store.keysql import SUBJECT_KEY_BASE, DataKeyRow

    return DataKeyRow(tenant, SUBJECT_KEY_BASE + 1, "k", b"wrapped", 0.0, "digest")


@pytest.mark.slow  # the CLI in a process, SIGKILLed
def test_an_erasure_killed_after_shredding_is_completed_by_running_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cairn erase`` dies (SIGKILL, fault point ``erase.after_shred``) once
    A's key is destroyed and before its rows are deleted: A is unreadable
    already, its record says unfinished; the same command completes it."""
    (tmp_path / "db").mkdir()
    keys = tmp_path / "keys"
    keys.write_text(f"kek1 {base64.b64encode(os.urandom(32)).decode()}\n")
    url = f"sqlite:///{tmp_path}/db/cairn.db"
    app = build(url, LocalKeyring.from_file(keys))
    runs = start_both(app)
    command = ["erase", "--subject", SUBJECT["A"], "--db", url, "--keyring", f"file:{keys}", "--json"]

    killed = processes.run("cairn", command, env={"CAIRN_FAULTS": "erase.after_shred"}, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (record,) = app.operator.erasures()
    assert record.finished_at is None
    assert app.store.run_subject(runs["A"]) == SUBJECT["A"]  # its rows are still there...
    monkeypatch.setattr(sealing, "KEY_REFRESH_SECONDS", 0.0)  # this process looks at the keys again now
    with pytest.raises(KeyErased):
        app.get_run(runs["A"])  # ...and unreadable already, here too (it had A's key cached)
    monkeypatch.undo()

    again = processes.run("cairn", command, timeout=60)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["resumed"] is True
    assert report["record"]["id"] == record.id
    assert report["counts"]["runs"] == 1
    assert report["record"]["finished_at"] is not None
    assert app.store.run_subject(runs["A"]) is None
    assert occurrences(rows_at_rest(url), SUBJECT["A"]) == 0
    assert_b_whole(app, runs["B"])
    app.close()


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_an_anchored_run_erased_verifies_as_erased_and_one_cut_out_is_still_tampered(
        sealed: bool, tmp_path: Path) -> None:
    app = build(f"sqlite:///{tmp_path}/cairn.db", keyring(tmp_path) if sealed else None)
    try:
        runs = start_both(app)
        key, anchor = tmp_path / "audit.key", tmp_path / "anchor.jsonl"
        generate_key(key)
        app.audit.checkpoint(key, anchor=anchor)
        assert app.audit.verify(anchor=anchor).verdict is Verdict.VERIFIED

        app.erase(subject=SUBJECT["A"])
        report = app.audit.verify(anchor=anchor)
        # the erasure's own two operator log records (started, finished) are newer than the anchor
        assert report.verdict is Verdict.UNANCHORED, report.summary()
        assert report.problems == []
        assert "2 newer entries" in report.summary()
        assert report.erased_runs == 1
        assert "ERASED" in report.summary()
        app.audit.checkpoint(key, anchor=anchor)
        assert app.audit.verify(anchor=anchor).verdict is Verdict.VERIFIED

        # B deleted without an erasure (raw SQL, as a rollback or an intruder would): still caught
        with sqlite3.connect(tmp_path / "cairn.db") as conn:
            conn.execute("DELETE FROM history WHERE run_id = ?", (runs["B"],))
        report = app.audit.verify(anchor=anchor)
        assert report.verdict is Verdict.TAMPERED
        assert "the run is gone" in report.summary()
    finally:
        app.close()


def test_erasing_a_thread_or_a_whole_tenant_leaves_every_other_tenant_whole(tmp_path: Path) -> None:
    app = build(f"sqlite:///{tmp_path}/cairn.db", keyring(tmp_path))
    try:
        def run(tenant: str, thread: str, subject: str | None) -> str:
            run_id = app.start("subjectwork", subject or thread, f"{tenant}/{thread}", tenant=tenant,
                               thread_id=thread, subject=subject).run_id
            assert execute_once(app, run_id) == "completed"
            return run_id

        t1 = {run("t1", "chat-1", "ann"), run("t1", "chat-2", None)}
        t2 = {run("t2", "chat-1", "ann"), run("t2", "chat-2", None)}
        done = app.erase(tenant="t2", thread="chat-2")
        assert done.counts["runs"] == 1
        assert done.counts["keys"] == 0  # a thread scope deletes, it does not shred
        assert app.store.thread_messages("t2", "thread-chat-2") == []  # what its run wrote, anywhere
        assert app.operator.memory("t2").get(("people",), "chat-2") is None
        assert app.operator.memory("t2").get(("people",), "ann") is not None
        assert len(app.list_runs(tenant="t2")) == 1

        done = app.erase(tenant="t1")  # the whole tenant: its runs, its memory, its subject keys
        assert done.counts == {"runs": 2, "killed": 0, "memory": done.counts["memory"], "keys": 1}
        assert done.counts["memory"] >= 4
        assert app.list_runs(tenant="t1") == []
        assert app.store.memory_items("t1") == []
        (left,) = app.list_runs(tenant="t2")
        assert left.run_id in t2
        assert app.handle(left.run_id).result(timeout=5)["tail"].startswith("t2/chat-1")
        assert {r.scope for r in app.operator.erasures()} == {"thread", "tenant"}
        assert t1.isdisjoint(r.run_id for r in app.list_runs())
    finally:
        app.close()


def test_cairn_erase_refuses_bad_input_in_one_line_and_records_the_cli_user(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cairn.cli.main import main

    url = f"sqlite:///{tmp_path}/cairn.db"
    app = cairn.App(db=url, lease_seconds=5.0)
    app.store.create_run(new_run("r1", subject="frank"))
    app.close()
    for args, says in ((["erase"], "name what to erase"),
                       (["erase", "--subject", "a", "--thread", "b"], "exclusive"),
                       (["erase", "--subject", "bad\x01id"], "control characters"),
                       (["erase", "--subject", ""], "non-empty")):
        done = CliRunner().invoke(main, [*args, "--db", url])
        assert done.exit_code == 2, done.output
        assert says in done.output
        assert "Traceback" not in done.output
    planned = CliRunner().invoke(main, ["erase", "--subject", "frank", "--dry-run", "--json", "--db", url])
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["counts"]["runs"] == 1
    runner = CliRunner(env={"CAIRN_ACTOR": "ops-ada"})
    done = runner.invoke(main, ["erase", "--subject", "frank", "--db", url])
    assert done.exit_code == 0, done.output
    assert "erased the subject of tenant 'default': 1 run(s)" in done.output
    app = cairn.App(db=url, lease_seconds=5.0)
    (record,) = app.operator.erasures()
    assert record.actor == "user:ops-ada"  # the CLI operator ($CAIRN_ACTOR: a configured identity)
    assert app.store.get_run("r1") is None
    app.close()
