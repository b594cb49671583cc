"""Rotation, verification and adoption cover every sealed column of the schema.

``cairn.store.rekey.SEALED_COLUMNS`` names each column that holds sealed
values and the pass that moves it; ``PLAIN_COLUMNS`` each other column that
holds bytes, and why. Two checks keep that list whole as the schema grows:

* statically, every byte column (SQLite ``BLOB``, PostgreSQL ``BYTEA``) of
  both dialects' ``schema.sql`` is in one of the two lists, and each listed
  pass is one a re-encryption runs;
* by behaviour, a database written through every sealed path (runs, entries,
  spilled payloads, signals, decisions and their comments, operator text,
  memory of all three tiers, workspace objects, artifacts, LangGraph values
  and checkpoints) is rotated and re-encrypted, then every column of every
  table is scanned, raw (bytes, base64 text, the sealed parts of JSON, cold
  copies thawed): every envelope found is on the newest key, every listed
  column was seen holding one, and no envelope is in a column the list
  does not name.

``cairn keys verify`` opens what a pass reads, so it covers the same
columns (a LangGraph value or a memory item moved to another row is a
failure naming its place); ``cairn keys adopt`` seals LangGraph rows too;
and on PostgreSQL a tenant's role is refused re-encryption in one line.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.api.keys import Keys
from cairn.errors import ConfigError
from cairn.security.envelope import AES_256_GCM, VERSION, is_envelope, tenant_tag
from cairn.security.keyring import LocalKeyring, new_kek_line
from cairn.store.coldvalues import thaw
from cairn.store.rekey import PLAIN_COLUMNS, REASON_PREFIX, SEALED_COLUMNS, Rekeyer, version_of
from cairn.store.sealed import SealedStore
from tests.encryption.test_rotation import cool
from tests.encryption.test_sealed_store import CANARY, Raw, build, drive, keyring

SQL = Path(cairn.__file__).parent / "store" / "sql"
#: sealed columns of text type (base64 of an envelope, or JSON holding one)
TEXT_SEALED = {("runs", "error"), ("history", "detail"), ("approvals", "comment"),
               ("memory_items", "index_text")}
#: the tenants written here, by the tag an envelope's header carries
TAGS = {tenant_tag(t) for t in ("a", "default")}


def key_version(data: bytes) -> int | None:
    """The key version of an envelope of a tenant written here (``None``:
    none; a hash that happens to start like one does not carry a tag too)."""
    if not is_envelope(data) or data[1] != VERSION or data[2] != AES_256_GCM or bytes(data[8:12]) not in TAGS:
        return None
    return version_of(data)


def byte_columns(dialect: str) -> set[tuple[str, str]]:
    """Every (table, column) of ``dialect``'s schema.sql whose type holds bytes."""
    text = (SQL / dialect / "schema.sql").read_text()
    if dialect == "sqlite":
        conn = sqlite3.connect(":memory:")
        conn.executescript(text)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {(t, r[1]) for t in tables for r in conn.execute(f"PRAGMA table_info('{t}')")
                if r[2].upper() == "BLOB"}
    found = set()
    for table, body in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)\s*\((.*?)\n\);", text, re.S):
        for column in re.findall(r"^\s*(\w+)\s+BYTEA\b", body, re.M | re.I):
            found.add((table, column))
    return found


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_every_column_holding_bytes_is_listed_sealed_or_plain(dialect: str) -> None:
    columns = byte_columns(dialect)
    assert {("runs", "input"), ("lg_values", "data")} <= columns  # the parser sees them
    unlisted = columns - set(SEALED_COLUMNS) - set(PLAIN_COLUMNS)
    assert not unlisted, f"{dialect}: columns holding bytes rekey.py neither moves nor explains: {unlisted}"
    both = byte_columns("sqlite") | byte_columns("postgres")
    assert not set(SEALED_COLUMNS) - both - TEXT_SEALED
    passes = inspect.getsource(Rekeyer.run)
    for column, name in SEALED_COLUMNS.items():
        assert callable(getattr(Rekeyer, name, None)), (column, name)
        assert f"self.{name}()" in passes, (column, name)


def envelopes(url: str) -> Iterator[tuple[str, str, int]]:
    """(table, column, key version) of every envelope anywhere in the database."""
    raw = Raw(url)
    if url.startswith("sqlite"):
        tables = [r[0] for r in raw("SELECT name FROM sqlite_master WHERE type = 'table'")]
    else:
        tables = [r[0] for r in raw("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_schema = 'cairn' AND table_type = 'BASE TABLE'")]
    for table in tables:
        if url.startswith("sqlite"):
            names = [r[1] for r in raw(f"PRAGMA table_info('{table}')")]
        else:
            names = [r[0] for r in raw("SELECT column_name FROM information_schema.columns WHERE "
                                       "table_schema = 'cairn' AND table_name = :t ORDER BY ordinal_position",
                                       t=table)]
        for row in raw(f"SELECT * FROM {table}"):
            values = dict(zip(names, row, strict=True))
            for column, value in values.items():
                for data in _sealed_parts(table, values, value):
                    version = key_version(data)
                    if version is not None:
                        yield table, column, version


def _sealed_parts(table: str, row: dict[str, Any], value: Any) -> list[bytes]:
    """The byte strings a stored value may hold an envelope in."""
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, bytes):
        if table == "memory_item_cold" and value is row.get("value"):
            return [thaw(row["codec"], row["size"], value, what="a cold copy")]
        return [value]
    if not isinstance(value, str):
        return []
    texts = [value]
    try:
        decoded = json.loads(value)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        texts += [v for v in decoded.values() if isinstance(v, str)]
    found = []
    for text in texts:
        text = text.removeprefix(REASON_PREFIX)
        try:
            found.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


def written_everywhere(url: str) -> cairn.App:
    """An App whose database holds a value on every sealed path."""
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    app = build(url, keyring())

    @app.step()
    def spill() -> str:  # inline (under 1 KiB) but over the spill size once sealed: history_payloads
        return base64.b64encode(os.urandom(700)).decode()

    @app.workflow(name="spilled")
    def spilled(ctx: cairn.Context) -> str:
        return spill()[:10]

    done = app.start("canary", f"{CANARY}-a", tenant="a").run_id
    # runs, entries, signals, decisions and their comments, memory, artifacts (large results)
    assert drive(app, done, "ok") == "completed"
    app.run(spilled)
    cancelled = app.start("canary", "c", tenant="a").run_id
    app.cancel(cancelled, reason=f"{CANARY} why")  # operator text
    store: Any = app.store
    cool(store)  # the cold tier
    run_id = app.start("canary", f"{CANARY}-ws", tenant="a").run_id
    claim = store.claim_run(run_id, "w1", 30.0, 0)
    store.put_workspace_objects(run_id, claim.run.epoch, {"ab" * 32: os.urandom(300)})
    saver = CairnSaver(app, tenant="a")  # LangGraph values and checkpoints
    counting_loop(3, f"{CANARY} says ").compile(checkpointer=saver).invoke(
        {"log": []}, {"configurable": {"thread_id": "t"}})
    return app


def test_after_a_rotation_and_a_pass_no_column_of_any_table_holds_a_value_on_an_old_key(place: str) -> None:
    app = written_everywhere(place)
    store: Any = app.store
    keys = Keys(store)
    before = {(t, c) for t, c, _ in envelopes(place)}
    dialect = "sqlite" if place.startswith("sqlite") else "postgres"
    expected = set(SEALED_COLUMNS) & (byte_columns(dialect) | TEXT_SEALED)
    assert before == expected, (f"sealed but not listed: {before - expected}; "
                                f"listed but never written here: {expected - before}")
    rotated = keys.rotate()
    assert {version for _, version in rotated} == {2}
    keys.reencrypt(page=3)
    left = {(t, c) for t, c, version in envelopes(place) if version != 2}
    assert not left, f"values left on a retired key in {sorted(left)}"
    assert all(not r.failures for r in keys.verify()), [r.failures for r in keys.verify()]
    from cairn.langgraph import CairnSaver

    latest = CairnSaver(app, tenant="a").get_tuple({"configurable": {"thread_id": "t"}})
    assert latest is not None
    assert latest.checkpoint["channel_values"]["log"][-1].startswith(CANARY)  # reads back after the move
    app.close()


def test_verify_opens_langgraph_rows_and_memory_and_names_a_moved_one(place: str) -> None:
    app = written_everywhere(place)
    keys = Keys(app.store)
    assert all(not r.failures for r in keys.verify())
    raw = Raw(place)
    (one, other) = raw("SELECT digest, data FROM lg_values WHERE tenant = 'a' ORDER BY digest LIMIT 2")
    raw("UPDATE lg_values SET data = :d WHERE tenant = 'a' AND digest = :g", d=bytes(other[1]), g=one[0])
    (item,) = raw("SELECT namespace, key FROM memory_items WHERE tenant = 'a' AND key = 'k0'")
    (note,) = raw("SELECT value FROM memory_items WHERE tenant = 'a' AND key = 'note' LIMIT 1")
    raw("UPDATE memory_items SET value = :v WHERE tenant = 'a' AND key = 'k0'", v=bytes(note[0]))
    (report,) = [r for r in keys.verify() if r.tenant == "a"]
    text = "\n".join(report.failures)
    assert f"lg_values.value at {one[0]}" in text, text
    where = json.dumps([item[0], item[1]], separators=(",", ":"))
    assert f"memory_items.value at {where}" in text, text
    app.close()


def test_cairn_keys_adopt_seals_langgraph_rows_written_without_encryption(
        place: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from cairn.cli.main import main as cli
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    monkeypatch.setenv("CAIRN_KEYRING", "")
    ring = tmp_path / "keys"
    ring.write_text(new_kek_line("k1") + "\n")
    plain = cairn.App(db=place, lease_seconds=5.0)
    counting_loop(3, f"{CANARY} says ").compile(checkpointer=CairnSaver(plain, tenant="a")).invoke(
        {"log": []}, {"configurable": {"thread_id": "t"}})
    before = CairnSaver(plain, tenant="a").get_tuple({"configurable": {"thread_id": "t"}})
    plain.close()
    done = CliRunner().invoke(cli, ["--db", place, "keys", "adopt", "--keyring", f"file:{ring}"])
    assert done.exit_code == 0, done.output
    raw = Raw(place)
    stored = [bytes(r[0]) for r in raw("SELECT data FROM lg_values")]
    stored += [bytes(v) for r in raw("SELECT checkpoint, metadata FROM lg_checkpoints") for v in r]
    assert stored
    assert {version_of(d) for d in stored} == {1}  # every row sealed
    app = cairn.App(db=place, lease_seconds=5.0, keyring=LocalKeyring.from_file(ring))
    after = CairnSaver(app, tenant="a").get_tuple({"configurable": {"thread_id": "t"}})
    assert after is not None
    assert before is not None
    assert after.checkpoint["channel_values"] == before.checkpoint["channel_values"]
    assert after.metadata == before.metadata
    app.close()


def test_reencryption_with_a_tenants_role_is_refused_in_one_line(pg_url: str) -> None:
    from tests.store.test_postgres_rls import deploy

    with deploy(pg_url) as deployment:
        ring = keyring()
        owner = SealedStore(deployment.owner, ring)
        owner.rotate("acme")  # the tenant's first data key, made by the owner
        for what, call in (("reencrypt", lambda keys: keys.reencrypt("acme")),
                           ("adopt", lambda keys: keys.adopt())):
            with pytest.raises(ConfigError) as refused:
                call(Keys(SealedStore(deployment.acme, ring)))
            message = str(refused.value)
            assert f"cairn keys {what} takes the database owner's role" in message
            assert "tenant's role" in message
            assert "\n" not in message
        assert Keys(owner).reencrypt("acme")[0].tenant == "acme"  # the owner may
