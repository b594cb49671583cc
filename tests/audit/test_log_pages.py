"""The audit log a page at a time (issue 26; api/auditlog.py), on both
backends: pages of any size, newest or oldest first, put together are the
whole log once each, in order, across the hot history (read from the store
a page at a time), an archived run and the operator log; entries that share
a time are ordered by run id byte-wise, as Python merges them, and a page
boundary among them loses or repeats none; filters hold across pages; a
cursor that is not one the log gave is refused with a one-line message."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import cairn
from cairn.api.auditlog import AuditEvent, LogFilter, cursor_of, event_of, position, record_of
from cairn.errors import InvalidArgument
from tests.encryption.test_sealed_store import Raw, build, drive
from tests.engine.conftest import postgres_url

#: run ids whose byte order (upper case first) is not a natural-language collation's
RUNS = ("Zeta", "alpha", "Beta", "beta-2")


def made(place: str) -> cairn.App:
    app = build(place, None)
    for run_id in RUNS:
        app.start("canary", f"text {run_id}", run_id=run_id, tenant="a")
        drive(app, run_id, "ok")
    app.start("canary", "theirs", run_id="theirs", tenant="b")
    drive(app, "theirs", "ok")
    app.operator.archive_run("beta-2")  # its entries come from its archive
    app.tokens.mint("a", "admin", "bot")  # an operator log record of tenant a
    raw = Raw(place)
    # entries of three runs at one time: only the run id and seq order them
    raw("UPDATE history SET at = 1000.0 WHERE run_id IN ('Zeta', 'alpha', 'Beta') AND seq <= 3")
    # as created then: no entry of a run is before its creation (the log reads a run from there)
    raw("UPDATE runs SET created_at = 1000.0 WHERE run_id IN ('Zeta', 'alpha', 'Beta')")
    return app


def whole_log(app: cairn.App, tenant: str | None) -> list[AuditEvent]:
    """The log as one sorted list, read without paging (every hot, archived and operator row)."""
    store = app.store
    rows = list(store.audit_entries(tenant=tenant))  # type: ignore[attr-defined]
    found = [event_of((r[0], r[1], r[2], r[3], r[4], r[5], r[14], r[17])) for r in rows]
    found += [record_of(r) for r in store.operator_log(tenant=tenant)]  # type: ignore[attr-defined]
    return sorted(found, key=position)


def paged(app: cairn.App, wanted: LogFilter, limit: int, newest: bool) -> list[AuditEvent]:
    seen: list[AuditEvent] = []
    after = None
    for _ in range(1000):
        page = app.audit.log_page(wanted, limit, after=after, newest=newest)
        assert len(page.entries) <= limit
        seen += page.entries
        if page.next_after is None:
            return seen
        assert len(page.entries) == limit  # a page short of its limit is the last
        after = page.next_after
    raise AssertionError("the pages did not end")


def test_pages_of_any_size_in_either_order_are_the_whole_log_once(place: str) -> None:
    app = made(place)
    want = whole_log(app, "a")
    assert {e.run_id for e in want if e.kind == "run"} == set(RUNS)
    assert any(e.kind == "token" for e in want)
    assert any(e.run_id == "beta-2" for e in want)
    tied = [e.run_id for e in want if e.at == 1000.0]
    assert tied[:3] == ["Beta", "Beta", "Beta"], tied  # byte order: upper case first
    assert tied[-1] == "alpha", tied
    for limit in (1, 2, 7, 1000):
        assert paged(app, LogFilter(tenant="a"), limit, newest=False) == want, limit
        assert paged(app, LogFilter(tenant="a"), limit, newest=True) == want[::-1], limit
    assert app.audit.log(tenant="a") == want
    assert app.audit.log(tenant="a", limit=3) == want[-3:]  # the CLI's: the last N, oldest first
    app.close()


@pytest.fixture
def natural_collation(pg_admin_url: str) -> Iterator[str]:
    """A PostgreSQL database whose text collation is a language's (ICU
    ``en``: ``alpha`` before ``Beta``), not the test cluster's byte order."""
    name = f"cairn_collation_{secrets.token_hex(4)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en' "
                             "LOCALE 'C'").format(sql.Identifier(name)))
    try:
        yield postgres_url(make_conninfo(pg_admin_url, dbname=name))
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_postgres_pages_order_run_ids_byte_wise_whatever_the_collation(natural_collation: str) -> None:
    """The hot rows are merged in Python with the archived and operator ones:
    the database must order and compare run ids as Python does."""
    app = made(natural_collation)
    (order,) = Raw(natural_collation)("SELECT string_agg(r, ' ' ORDER BY r) "
                                      "FROM unnest(ARRAY['Beta', 'alpha']) AS r")
    assert order == ("alpha Beta",), "the database must not order byte-wise, or this test proves nothing"
    want = whole_log(app, "a")
    for limit in (1, 3):
        assert paged(app, LogFilter(tenant="a"), limit, newest=False) == want, limit
        assert paged(app, LogFilter(tenant="a"), limit, newest=True) == want[::-1], limit
    app.close()


def test_filters_hold_across_pages(place: str) -> None:
    app = made(place)
    want = whole_log(app, "a")
    workers = [e for e in want if "worker:" in e.actor]
    assert 0 < len(workers) < len(want)
    assert paged(app, LogFilter(tenant="a", actor="worker:"), 2, newest=True) == workers[::-1]
    runs = [e for e in want if e.kind == "run"]
    assert paged(app, LogFilter(tenant="a", kind="run"), 3, newest=False) == runs
    one = [e for e in want if e.run_id == "alpha"]
    assert paged(app, LogFilter(tenant="a", run_id="alpha"), 2, newest=False) == one
    later = [e for e in want if e.at >= 1001.0]
    assert paged(app, LogFilter(tenant="a", since=1001.0), 4, newest=True) == later[::-1]
    theirs = paged(app, LogFilter(tenant="b"), 2, newest=False)
    assert theirs == whole_log(app, "b")
    assert {e.tenant for e in theirs} == {"b"}
    app.close()


def test_a_cursor_the_log_did_not_give_is_refused_in_one_line(place: str) -> None:
    app = made(place)
    import base64

    forged = [base64.urlsafe_b64encode(text).decode() for text in (b"[1.0, 2]", b"{}", b'[1, "r", "3"]')]
    for bad in ("x", "!!!!", "", "a" * 600, *forged):
        with pytest.raises(InvalidArgument, match="not one the audit log gave") as raised:
            app.audit.log_page(LogFilter(tenant="a"), 5, after=bad)
        assert "\n" not in str(raised.value)
    # a cursor holds a place and nothing else: one past every entry gives an empty last page
    end = app.audit.log_page(LogFilter(tenant="a"), 5, after=cursor_of((9e12, "", 0)), newest=False)
    assert (end.entries, end.next_after) == ([], None)
    app.close()
