"""The audit chain as the database writes it (issue 26): every entry of
every write path gets its link, in the transaction that writes it, over the
row as stored; the verifier recomputes each link and names the first bad
entry. Both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.api.auditchain import Chains, verify_chains
from cairn.store.auditlinks import link


def scan(app: cairn.App, **where: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return app.store.audit_scan(lambda entries, links, _: (list(entries), list(links)), **where)


def verify(app: cairn.App, **where: Any) -> Chains:
    return app.store.audit_scan(verify_chains, **where)


def test_every_entry_is_linked_over_its_stored_row(app: cairn.App) -> None:
    app.run("steps", 6, run_id="r1")
    handle = app.start("steps", 2, run_id="r2")
    app.cancel(handle.run_id, "no longer needed")  # an operator's entry
    entries, links = scan(app)
    assert [(e[0], e[1]) for e in entries] == [(k[0], k[1]) for k in links]
    previous: dict[str, bytes] = {}
    for entry, stored in zip(entries, links, strict=True):
        assert link(previous.get(entry[0]), entry) == bytes(stored[3])
        assert stored[2] == entry[2]  # the tenant
        previous[entry[0]] = bytes(stored[3])
    compressed = [e for e in entries if e[13] is not None and e[13][:2] == b"\x00\x01"]
    assert compressed, "the large payload is linked as stored (packed), not as decoded"
    chains = verify(app)
    assert chains.problems == []
    assert chains.entries == len(entries)
    assert set(chains.heads) == {"r1", "r2"}


def test_a_run_is_verified_alone(app: cairn.App) -> None:
    app.run("steps", 3, run_id="a")
    app.run("steps", 3, run_id="b")
    chains = verify(app, run_id="b")
    assert set(chains.heads) == {"b"}
    assert chains.problems == []
    assert verify(app, tenant="nobody").entries == 0


def test_the_migration_links_the_history_already_written(app: cairn.App) -> None:
    """A database from before the audit chain: its history is linked by the
    migration, each run from its first entry, and verifies."""
    app.run("steps", 5, run_id="old1")
    handle = app.start("steps", 2, run_id="old2")
    app.cancel(handle.run_id, "before the audit chain")
    sqlite = type(app.store).__name__ == "SQLiteStore"
    url = app.db_url
    assert url is not None
    before = scan(app)[0]
    app.close()
    if sqlite:
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.executescript("DROP TABLE audit_links; DROP TABLE audit_pruned; DROP TABLE audit_checkpoints; "
                           "DELETE FROM schema_migrations WHERE version = 23;")
        conn.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET search_path = cairn")
            conn.execute("DROP TRIGGER audit_link ON history; DROP FUNCTION audit_link_entries(); "
                         "DROP FUNCTION audit_canonical(history), audit_mp_text(text), "
                         "audit_mp_bytes(bytea), "
                         "audit_mp_int(bigint), audit_mp_float(double precision); "
                         "DROP TABLE audit_links, audit_pruned, "
                         "audit_checkpoints; DELETE FROM schema_migrations WHERE version = 32")
    reopened = cairn.App(db=url)
    try:
        entries, links = scan(reopened)
        assert entries == before
        assert len(links) == len(entries)
        chains = verify(reopened)
        assert chains.problems == []
        assert set(chains.heads) == {"old1", "old2"}
    finally:
        reopened.close()


def test_pruning_keeps_each_runs_last_link(app: cairn.App) -> None:
    import time

    app.run("steps", 2, run_id="gone")
    head = verify(app).heads["gone"]
    assert app.store.prune_runs(time.time() + 60) == 1
    assert scan(app) == ([], [])
    assert [(r[0], r[2], bytes(r[3])) for r in app.store.audit_pruned()] == [("gone", head.seq, head.link)]


INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -32, -33, -128, -129,
        -32768, -32769, -2**31, -2**31 - 1, -2**63]
SIZES = [0, 1, 31, 32, 255, 256, 65535, 65536, 70000]


def test_the_database_encodes_every_value_as_python_does(app: cairn.App) -> None:
    """Rows written straight into the table (the trigger links them) with
    integers, text and bytes at every size boundary of the encoding: the
    database's links are Python's (PostgreSQL builds the bytes in SQL)."""
    from tests.audit.test_tamper import raw

    texts = ["", "é", *("x" * (n - 2) + "é" for n in SIZES if n >= 2)]
    rows = []
    for i, number in enumerate(INTS):
        size = SIZES[i % len(SIZES)]
        rows.append((f"edge{i}", number, "t" * (i + 1), texts[i % len(texts)], [0.0, -0.0, 1e300, 0.1][i % 4],
                     number, None if i % 3 else "w", number, "step", texts[(i + 3) % len(texts)],
                     "h" * size, number, None if i % 2 else 1.5, bytes([i % 256]) * size, None,
                     '{"actor": "x"}' if i % 2 else None))
    sqlite = type(app.store).__name__ == "SQLiteStore"
    statements = []
    for row in rows:
        values = ", ".join(_literal(v, sqlite) for v in row)
        statements.append(f"INSERT INTO history (run_id, seq, tenant, event, at, epoch, worker, position, "
                          f"step_kind, name, input_hash, attempt, started_at, payload, payload_ref, detail) "
                          f"VALUES ({values})")
    if sqlite:  # the trigger is a connection's: write through the store's own
        conn = app.store._conn()  # type: ignore[attr-defined]
        for statement in statements:
            conn.execute(statement)
    else:
        raw(app, ";".join(statements))
    entries, links = scan(app)
    assert len(entries) == len(rows) == len(links)
    for entry, stored in zip(entries, links, strict=True):
        assert link(None, entry) == bytes(stored[3]), entry[:2]
    assert sorted(tuple(e) for e in entries) == sorted(rows)


def _literal(value: object, sqlite: bool) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'" if sqlite else f"'\\x{value.hex()}'::bytea"
    if isinstance(value, float):
        return "-0.0" if str(value) == "-0.0" else repr(value)
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def test_verdicts_per_tenant_and_run_and_a_refused_checkpoint(app: cairn.App, tmp_path: Path) -> None:
    from cairn.api import auditanchor
    from cairn.api.audit import AuditRefused, Verdict
    from tests.audit.test_tamper import raw

    app.run("steps", 2, run_id="a1", tenant="acme")
    app.run("steps", 2, run_id="g1", tenant="globex")
    key, anchor = tmp_path / "k", tmp_path / "anchor.jsonl"
    auditanchor.generate_key(key)
    records = app.audit.checkpoint(key, anchor=anchor)
    assert [r["tenant"] for r in records] == ["acme", "globex"]
    app.run("steps", 1, run_id="g2", tenant="globex")  # after the checkpoint
    assert app.audit.verify(anchor=anchor, tenant="acme").verdict is Verdict.VERIFIED
    assert app.audit.verify(anchor=anchor, run_id="g1").verdict is Verdict.VERIFIED
    newer = app.audit.verify(anchor=anchor, tenant="globex")
    assert newer.verdict is Verdict.UNANCHORED
    assert newer.unanchored == len(app.history("g2"))
    assert "newer entries are verified only as a chain" in newer.summary()
    raw(app, "UPDATE history SET name = 'other' WHERE run_id = 'g1' AND seq = 4")
    with pytest.raises(AuditRefused, match="not checkpointed: TAMPERED: run 'g1' entry 4"):
        app.audit.checkpoint(key, anchor=anchor)
    assert len(anchor.read_text().splitlines()) == 2  # nothing appended
    assert app.audit.verify(anchor=anchor, tenant="acme").verdict is Verdict.VERIFIED
