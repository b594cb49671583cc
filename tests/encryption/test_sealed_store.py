"""Encryption at rest on both backends (cairn.store.sealed): a canary
written through every sealed path appears nowhere at rest; every sealed
column copied to another tenant, run or position is refused; plaintext
injected in place of an envelope is refused; a wrong or missing key stops a
run with a clear error and overwrites nothing; replay after a key rotation
reads the values recorded before it."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import sqlite3
import subprocess
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cairn
from cairn.engine.bundles import Bundle
from cairn.errors import ConfigError
from cairn.security.envelope import SealError
from cairn.security.keyring import LocalKeyring
from cairn.store.memrecords import ItemPut, Provenance
from cairn.store.records import Payload, RunStatus
from tests.engine.conftest import execute_once
from tests.store.test_schema import pg_dump_binary

CANARY = "Zq7canaryXw9"


def forms(value: str) -> list[bytes]:
    """The byte strings that show ``value`` in a file, a row or a dump."""
    raw = value.encode()
    found = {raw, raw.hex().encode(), raw.hex().upper().encode(), value.encode("utf-16-le"),
             value.encode("utf-16-be")}
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b"\0" * shift + raw)
            found.add(text[4 if shift else 0:-4])
    return sorted(found)


def inflated(blob: bytes) -> Iterator[bytes]:
    """Every zlib or gzip stream found anywhere in ``blob``, decompressed."""
    for start in range(len(blob) - 2):
        pair = blob[start:start + 2]
        if (pair[0] == 0x78 and pair[1] in (0x01, 0x5E, 0x9C, 0xDA)) or pair == b"\x1f\x8b":
            try:
                yield zlib.decompressobj(47).decompress(blob[start:], 1 << 20)
            except zlib.error:
                continue


def hits(blob: bytes) -> list[str]:
    found = [f"{form!r}" for form in forms(CANARY) if form in blob]
    found += [f"zlib@{i}" for i, out in enumerate(inflated(blob)) if any(f in out for f in forms(CANARY))]
    return found


def keyring() -> LocalKeyring:
    return LocalKeyring({"kek1": os.urandom(32)}, "kek1")


def build(url: str, ring: LocalKeyring | None, inline_limit: int = 1024) -> cairn.App:
    app = cairn.App(db=url, keyring=ring, lease_seconds=5.0, inline_limit=inline_limit)  # larger: artifacts

    @app.step()
    def shout(text: str) -> str:
        return f"{text} {CANARY}-step"

    @app.step()
    def big(text: str) -> str:
        return f"{text} {CANARY}-artifact " + "z" * 2000

    @app.workflow(name="canary")
    def canary(ctx: cairn.Context, text: str) -> dict[str, Any]:
        loud = shout(text)
        large = big(text)
        ctx.memory.put(("docs",), "note", f"{CANARY}-memory", index=f"{CANARY}-index " + text[:20])
        ctx.memory.run.put("scratch", f"{CANARY}-run-memory")
        ctx.memory.thread(f"th-{text[-6:]}").append(f"{CANARY}-thread")
        ctx.set_event("progress", f"{CANARY}-event")
        signal = ctx.wait_for_signal("go")
        decision = ctx.request_approval("ship", {"note": f"{CANARY}-approval"})
        if signal == "fail":
            raise ValueError(f"{CANARY}-error")
        return {"loud": loud, "signal": signal, "decision": decision.data, "tail": f"{CANARY}-result",
                "large": large[:40]}

    return app


def drive(app: cairn.App, run_id: str, signal: str) -> str:
    assert execute_once(app, run_id) == "suspended"  # at the signal
    app.signal(run_id, "go", signal if signal == "fail" else f"{CANARY}-signal")
    assert execute_once(app, run_id) == "suspended"  # at the approval
    (request,) = app.approvals(run_id=run_id)
    app.approve(run_id, request.request_id, edit={"note": f"{CANARY}-edit"}, comment=f"{CANARY}-comment")
    return execute_once(app, run_id)


def rows_at_rest(url: str) -> bytes:
    """Every byte of the database: the SQLite file, WAL and -shm, or pg_dump."""
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in path.parent.rglob("*") if p.is_file())  # artifacts too
    return subprocess.run([pg_dump_binary(), "--data-only", "--schema=cairn", "-d", url.replace(
        "postgresql://", "postgresql://", 1)], check=True, capture_output=True).stdout


@pytest.mark.slow  # pg_dump is a process
@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain-control"])
def test_a_canary_through_every_sealed_path_is_nowhere_at_rest(place: str, sealed: bool,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """The control (encryption off) finds the canary: the scan sees what it looks for."""
    caplog.set_level(logging.DEBUG)
    app = build(place, keyring() if sealed else None)
    done = app.start("canary", f"{CANARY}-input" + "y" * 2000).run_id  # an input stored as an artifact
    assert drive(app, done, "ok") == "completed"
    failed = app.start("canary", f"{CANARY}-input2").run_id
    assert drive(app, failed, "fail") == "failed"
    cancelled = app.start("canary", f"{CANARY}-c").run_id
    app.cancel(cancelled, reason=f"{CANARY}-cancel reason")
    killed = app.start("canary", f"{CANARY}-k", tenant="t2").run_id
    app.kill(tenant="t2", reason=f"{CANARY}-kill reason")
    assert app.store.get_run(cancelled).error["message"] == f"{CANARY}-cancel reason"
    assert app.history(killed)[-1].detail["reason"] == f"{CANARY}-kill reason"
    moved = Bundle.build("canary", "2", "ast:two", {}, {}, []).record()  # an operator's forced move
    app.store.put_bundles([moved])
    app.store.migrate_run(killed, moved, {"check": f"{CANARY}-check", "compatible": False, "forced": True,
                                          "reason": f"{CANARY}-migrate reason"}, actor="cli:ops")
    migrated = app.history(killed)[-1].detail
    lost = app.start("canary", f"{CANARY}-q").run_id  # the store's own JSON: lease, quarantine, budget
    assert app.store.claim_run(lost, "w1", 5.0, 0) is not None
    now = app.store.clock
    app.store.clock = lambda: now() + 60.0  # its lease expired: the next claim is a takeover, one too many
    try:
        assert app.store.claim_run(lost, "w2", 5.0, 0) is None
    finally:
        app.store.clock = now
    app.store.set_budget(lost, {"tokens": 1000}, actor="cli:ops")
    app.store.write_memory("default", [ItemPut("cold\x1f", "k", Payload(json.dumps(
        f"{CANARY}-cold " + "c" * 200).encode()), None, None)], Provenance())
    app.store.clock = lambda: now() + 3600.0  # nobody read it for an hour: its value goes cold
    try:
        assert app.store.tier_items(60.0).cooled >= 1
    finally:
        app.store.clock = now
    (cold,) = [i for i in app.store.memory_items("default", "cold\x1f") if i.key == "k"]
    assert CANARY in cold.value.data.decode()  # read through from the cold copy
    assert [e.event.value for e in app.history(lost)][-3:] == ["lease.lost", "run.quarantined",
                                                                "run.budget_changed"]
    assert (migrated["reason"], migrated["check"], migrated["forced"]) == (
        f"{CANARY}-migrate reason", f"{CANARY}-check", True)
    result = app.handle(done).result(timeout=5)
    assert result["decision"] == {"note": f"{CANARY}-edit"}
    assert [a.comment for a in app.store.approvals(run_id=done, pending=False)] == [f"{CANARY}-comment"]
    assert result["signal"] == f"{CANARY}-signal"
    assert result["large"].startswith(f"{CANARY}-input")
    assert app.store.get_run(done).input.ref is not None  # the input is an artifact
    assert CANARY in app.store.get_run(failed).error["message"]
    assert app.get_event(done, "progress") == f"{CANARY}-event"
    item = app.store.memory_item("default", "docs\x1f", "note")
    assert item is not None
    assert CANARY in item.value.data.decode()
    assert CANARY in (item.index_text or "")
    assert CANARY in app.store.run_memory(done)[0].value.data.decode()
    events = json.dumps([e.detail for e in app.history(failed)], default=str)
    assert CANARY in events  # the error is read back from the sealed detail
    app.close()
    assert hits(caplog.text.encode()) == []  # nor in this process's log records, at any level
    found = hits(rows_at_rest(place))
    assert found == [] if sealed else len(found) > 0


class Raw:
    """Statements on the database under the store, as an attacker with
    write access to it would run them (``:name`` parameters on both)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, statement: str, **params: Any) -> list[tuple[Any, ...]]:
        if self.url.startswith("sqlite"):
            with sqlite3.connect(self.url.removeprefix("sqlite:///")) as conn:
                return conn.execute(statement, params).fetchall()
        with self._postgres() as conn:
            cursor = conn.execute(self._pyformat(statement), params)
            return cursor.fetchall() if cursor.description is not None else []

    def each(self, statement: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Run ``statement`` once for each of ``rows`` (its parameters), on one
        connection and, on SQLite, in one transaction: as an attacker rewriting
        a table would. A call of ``self`` per row cost a connection each (a
        server process forked on PostgreSQL, a commit on SQLite), which made
        the tamper tests' write-backs (thousands of rows) their slowest part."""
        if self.url.startswith("sqlite"):
            with sqlite3.connect(self.url.removeprefix("sqlite:///")) as lite:
                lite.executemany(statement, rows)
            return
        with self._postgres() as conn, conn.cursor() as cursor:
            cursor.executemany(self._pyformat(statement), rows)

    def _postgres(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = psycopg.connect(self.url, autocommit=True)
        conn.execute("SET search_path TO cairn")
        return conn

    @staticmethod
    def _pyformat(statement: str) -> str:
        """``statement`` with psycopg's ``%(name)s`` for each ``:name``."""
        return re.sub(r":(\w+)", r"%(\1)s", statement)


#: every sealed column: (table, column, the key columns of its row)
SEALED = [("runs", "input", ("run_id",)), ("runs", "result", ("run_id",)), ("runs", "error", ("run_id",)),
          ("history", "payload", ("run_id", "seq")), ("history", "detail", ("run_id", "seq")),
          ("mailbox", "payload", ("run_id", "seq")), ("approvals", "comment", ("run_id",))]


def read_back(app: cairn.App, table: str, run_id: str) -> None:
    """Read what ``table`` holds of ``run_id`` through the store."""
    if table == "runs":
        app.store.get_run(run_id)
    elif table == "history":
        app.history(run_id)
    elif table == "approvals":
        app.store.approvals(run_id=run_id, pending=False)
    else:
        app.store.deliveries(run_id)


def runs_of(app: cairn.App) -> dict[str, str]:
    """Six finished runs: a completed and a failed one for tenant a (twice) and b."""
    made = {}
    for name, tenant, signal in (("a1", "a", "ok"), ("a2", "a", "ok"), ("b1", "b", "ok"),
                                 ("fa1", "a", "fail"), ("fa2", "a", "fail"), ("fb1", "b", "fail")):
        made[name] = app.start("canary", f"{CANARY}-{name}", tenant=tenant).run_id
        drive(app, made[name], signal)
    return made


def test_every_sealed_column_copied_to_another_tenant_run_or_position_is_refused(place: str) -> None:
    app = build(place, keyring())
    runs = runs_of(app)
    raw = Raw(place)
    tried = refused = 0
    for table, column, keys in SEALED:
        failed = column == "error"
        source_run, same_tenant, other_tenant = ((runs["fa1"], runs["fa2"], runs["fb1"]) if failed
                                                 else (runs["a1"], runs["a2"], runs["b1"]))
        where = " AND ".join(f"{k} = :{k}" for k in keys)
        rows = raw(f"SELECT {', '.join(keys)}, {column} FROM {table} WHERE run_id = :run_id "
                   f"AND {column} IS NOT NULL ORDER BY {', '.join(keys)}", run_id=source_run)
        if column == "detail":
            rows = [r for r in rows if "sealed" in json.loads(r[-1])]
        assert rows, f"no sealed {table}.{column} to copy"
        for row in rows:
            source = dict(zip(keys, row[:-1], strict=True))
            targets = [{**source, "run_id": same_tenant}, {**source, "run_id": other_tenant}]
            targets += [dict(zip(keys, other[:-1], strict=True)) for other in rows if other != row][:2]
            for target in targets:
                before = raw(f"SELECT {column} FROM {table} WHERE {where}", **target)
                if not before:
                    continue
                raw(f"UPDATE {table} SET {column} = :value WHERE {where}", value=row[-1], **target)
                tried += 1
                try:
                    with pytest.raises(SealError) as caught:
                        read_back(app, table, target["run_id"])
                    refused += 1
                    assert target["run_id"] in str(caught.value)
                    assert table in str(caught.value)
                finally:
                    raw(f"UPDATE {table} SET {column} = :value WHERE {where}", value=before[0][0], **target)
                read_back(app, table, target["run_id"])  # restored: reads again
    assert tried >= 30
    assert refused == tried


@pytest.mark.parametrize(("table", "column", "plain"), [
    ("runs", "input", b'{"text": "injected"}'), ("history", "payload", b'"injected"'),
    ("mailbox", "payload", b'"injected"'), ("history", "detail", '{"sealed": "aW5qZWN0ZWQ="}'),
    ("runs", "result", b'{"loud": "injected"}'), ("approvals", "comment", "injected")])
def test_plaintext_injected_in_place_of_an_envelope_is_refused(place: str, table: str, column: str,
                                                               plain: Any) -> None:
    app = build(place, keyring())
    run_id = runs_of_one(app)
    raw = Raw(place)
    raw(f"UPDATE {table} SET {column} = :value WHERE run_id = :run_id AND {column} IS NOT NULL"
        + (" AND detail LIKE :pattern" if column == "detail" else ""), value=plain, run_id=run_id,
        **({"pattern": "%sealed%"} if column == "detail" else {}))
    with pytest.raises(SealError, match=r"not encrypted|does not decrypt"):
        read_back(app, table, run_id)


@pytest.mark.parametrize(("table", "column", "key"), [("history", "detail", "error"),
                                                      ("runs", "error", "traceback")])
def test_plaintext_added_beside_a_sealed_json_value_is_refused(place: str, table: str, column: str,
                                                               key: str) -> None:
    app = build(place, keyring())
    run_id = app.start("canary", f"{CANARY}-x").run_id
    assert drive(app, run_id, "fail") == "failed"
    raw = Raw(place)
    keys = "seq" if table == "history" else "run_id"
    found = raw(f"SELECT {keys}, {column} FROM {table} WHERE run_id = :run_id AND {column} LIKE :pattern",
                run_id=run_id, pattern="%sealed%")
    rows = [(k, json.loads(v)) for k, v in found]
    assert rows
    where, value = rows[-1]
    raw(f"UPDATE {table} SET {column} = :value WHERE run_id = :run_id AND {keys} = :where",
        value=json.dumps({**value, key: "injected"}), run_id=run_id, where=where)
    with pytest.raises(SealError, match=rf"plaintext beside its sealed value \({key}\)"):
        read_back(app, table, run_id)
    app.close()


def runs_of_one(app: cairn.App) -> str:
    run_id = app.start("canary", f"{CANARY}-one").run_id
    assert drive(app, run_id, "ok") == "completed"
    return run_id


def test_a_wrong_key_parks_the_run_with_a_clear_error_and_overwrites_nothing(place: str) -> None:
    right = keyring()
    app = build(place, right)
    run_id = app.start("canary", f"{CANARY}-w").run_id
    assert execute_once(app, run_id) == "suspended"
    raw = Raw(place)
    app.signal(run_id, "go", "x")
    entries = "SELECT seq, payload, detail FROM history WHERE run_id = :run_id ORDER BY seq"
    before = raw(entries, run_id=run_id)
    input_before = raw("SELECT input FROM runs WHERE run_id = :run_id", run_id=run_id)
    app.close()
    wrong = build(place, keyring())  # another KEK: the data key does not unwrap
    claim = wrong.store.claim_run(run_id, "w", 5.0, 5)
    assert claim is None  # not handed to the engine: parked
    status, = raw("SELECT status FROM runs WHERE run_id = :run_id", run_id=run_id)[0]
    assert status == RunStatus.NEEDS_ATTENTION.value
    after = raw("SELECT seq, payload, detail FROM history WHERE run_id = :run_id ORDER BY seq", run_id=run_id)
    assert after[:len(before)] == before
    assert raw("SELECT input FROM runs WHERE run_id = :run_id",
                                                 run_id=run_id) == input_before
    assert "does not unwrap" in after[-1][2]  # the error, named, in the run's journal
    with pytest.raises(SealError, match="does not unwrap"):
        wrong.start("canary", "new input")  # refused at start: nothing stored
    wrong.close()
    reopened = build(place, right)
    assert reopened.store.get_run(run_id).input.data is not None  # the right key still opens it all
    assert [e.seq for e in reopened.history(run_id)] == [r[0] for r in after]
    reopened.close()


def test_an_encrypted_database_is_refused_without_its_keyring(place: str) -> None:
    app = build(place, keyring())
    runs_of_one(app)
    app.close()
    with pytest.raises(ConfigError, match="this database is encrypted"):
        cairn.App(db=place)


def test_replay_after_a_rotation_returns_the_values_recorded_before_it(place: str) -> None:
    app = build(place, keyring())
    run_id = app.start("canary", f"{CANARY}-r").run_id
    assert execute_once(app, run_id) == "suspended"  # step and event sealed with key 1
    assert app.store.rotate("default") == 2
    app.signal(run_id, "go", "after rotation")  # sealed with key 2
    assert execute_once(app, run_id) == "suspended"  # replays the step recorded under key 1
    (request,) = app.approvals(run_id=run_id)
    app.approve(run_id, request.request_id)
    assert execute_once(app, run_id) == "completed"
    result = app.handle(run_id).result(timeout=5)
    assert result["loud"] == f"{CANARY}-r {CANARY}-step"
    assert result["signal"] == "after rotation"
    versions = {int.from_bytes(bytes(p)[4:8], "big") for (p,) in Raw(place)(
        "SELECT payload FROM history WHERE run_id = :run_id AND payload IS NOT NULL", run_id=run_id)}
    assert versions == {1, 2}
    app.close()


def test_artifacts_dedup_within_a_tenant_only_and_open_only_as_their_tenants(place: str) -> None:
    app = build(place, keyring())
    text = f"{CANARY}-shared" + "s" * 2000
    a1, a2 = (app.start("canary", text, tenant="a").run_id for _ in range(2))
    b1 = app.start("canary", text, tenant="b").run_id
    refs = {r: app.store.get_run(r).input.ref for r in (a1, a2, b1)}
    assert refs[a1] == refs[a2]  # equal content: one artifact per tenant
    assert refs[a1] != refs[b1]
    for run_id in (a1, a2, b1):
        assert execute_once(app, run_id) == "suspended"
    raw = Raw(place)
    raw("UPDATE runs SET input_ref = :ref WHERE run_id = :run_id", ref=refs[a1], run_id=b1)
    with pytest.raises(cairn.errors.PayloadError, match="another tenant"):
        app.runtime.payloads.raw(app.store.get_run(b1).input, what="the input")  # tenant a's bytes
    app.signal(b1, "go", "x")
    outcome = execute_once(app, b1)  # replay reads its input: tenant a's artifact, refused
    assert outcome not in ("suspended", "completed"), outcome
    assert "another tenant" in json.dumps(app.history(b1)[-1].detail)
    raw("UPDATE runs SET input_ref = :ref WHERE run_id = :run_id", ref=refs[b1], run_id=b1)
    assert app.runtime.payloads.raw(app.store.get_run(b1).input, what="x").decode().count(CANARY) == 1
    app.close()


def test_memory_values_and_texts_copied_to_another_tenant_or_key_are_refused(place: str) -> None:
    app = build(place, keyring())
    a = app.start("canary", f"{CANARY}-ma", tenant="a").run_id
    b = app.start("canary", f"{CANARY}-mb", tenant="b").run_id
    for run_id in (a, b):
        assert execute_once(app, run_id) == "suspended"
    app.store.write_memory("a", [ItemPut("docs\x1f", "other", Payload(b'"x"'), None, "other text")],
                           Provenance())
    raw = Raw(place)
    where = "tenant = :tenant AND namespace = :ns AND key = :key"
    for column in ("value", "index_text"):
        (source,), = raw(f"SELECT {column} FROM memory_items WHERE {where}", tenant="a", ns="docs\x1f",
                         key="note")
        for tenant, key in (("b", "note"), ("a", "other")):
            (before,), = raw(f"SELECT {column} FROM memory_items WHERE {where}", tenant=tenant, ns="docs\x1f",
                             key=key)
            raw(f"UPDATE memory_items SET {column} = :value WHERE {where}", value=source, tenant=tenant,
                ns="docs\x1f", key=key)
            with pytest.raises(SealError, match=rf"memory_items\.{column}"):
                app.store.memory_item(tenant, "docs\x1f", key)
            raw(f"UPDATE memory_items SET {column} = :value WHERE {where}", value=before, tenant=tenant,
                ns="docs\x1f", key=key)
            assert app.store.memory_item(tenant, "docs\x1f", key) is not None
    raw("UPDATE memory_run SET value = (SELECT value FROM memory_run WHERE run_id = :a) WHERE run_id = :b",
        a=a, b=b)
    with pytest.raises(SealError, match=r"memory_run\.value"):
        app.store.run_memory(b)
    threads = raw("SELECT tenant, thread_id FROM memory_thread_messages ORDER BY tenant")
    (ta, tha), (tb, thb) = threads[0], threads[-1]
    raw("UPDATE memory_thread_messages SET value = (SELECT value FROM memory_thread_messages "
        "WHERE tenant = :ta AND thread_id = :tha) WHERE tenant = :tb AND thread_id = :thb",
        ta=ta, tha=tha, tb=tb, thb=thb)
    with pytest.raises(SealError, match=r"memory_threads\.value"):
        app.store.thread_messages(tb, thb)  # another tenant's thread message
    app.close()
