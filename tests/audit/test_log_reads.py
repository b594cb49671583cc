"""A page of the audit log reads what it shows, not the tenant's history
(issue 26; api/auditlog.py): with many archived runs and operator records,
a page opens only the archives whose recorded time range reaches it and
reads about a page of operator records and hot rows past its cursor, the
first page as a deep one, newest or oldest first (counted through the
store: the archives it opens, the rows its statements return); the pages
put together are the whole log in both orders, with each filter; another
tenant's archives and records are never read nor shown, whatever the
cursor."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import cairn
from cairn.api.auditlog import AuditEvent, LogFilter, cursor_of, position
from cairn.store.oplog import chain_id
from tests.audit.test_log_pages import paged, whole_log
from tests.encryption.test_sealed_store import Raw

RUNS = 12  # runs of tenant a, two in three archived (each an archive of its own, in its own time)
MINTED = 3  # operator records of tenant a between two runs
LIMIT = 4
HOT = {"a-hot", *(f"a{i:02d}" for i in range(0, RUNS, 3))}


class Reads:
    """What a store read, by wrapping its methods on the instance: the
    archives opened (by tenant) and the rows each statement returned."""

    def __init__(self, store: Any) -> None:
        self.opened: list[tuple[str, str]] = []
        self.rows: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        opened, select = store.archived_history, store._select

        def counted_open(record: Any) -> list[Any]:
            self.opened.append((record.tenant, record.run_id))
            return list(opened(record))

        def counted_select(name: str, params: Any) -> list[Any]:
            found = select(name, params)
            self.rows[name] += len(found)
            self.calls[name] += 1
            return list(found)

        store.archived_history, store._select = counted_open, counted_select

    def reset(self) -> None:
        self.opened.clear()
        self.rows.clear()
        self.calls.clear()

    def hot(self) -> int:
        """Hot entries read (the runs' own statements)."""
        return sum(n for name, n in self.rows.items() if name.startswith("audit_log_run_"))

    def hot_runs(self) -> int:
        """Hot runs opened: each one's first statement (a run read past a page would count twice)."""
        return sum(n for name, n in self.calls.items() if name.startswith("audit_log_run_"))

    def operator(self) -> int:
        return sum(n for name, n in self.rows.items() if name.startswith("oplog_log_"))


def made(place: str) -> tuple[cairn.App, Reads]:
    app = cairn.App(db=place)

    @app.workflow(name="w")
    def w(ctx: cairn.Context, x: int) -> int:
        return x

    for i in range(RUNS):
        for tenant in ("a", "b"):  # b's runs and records interleave with a's in time
            app.run(w, i, run_id=f"{tenant}{i:02d}", tenant=tenant)
            if i % 3:
                app.operator.archive_run(f"{tenant}{i:02d}")
            for k in range(MINTED):
                app.tokens.mint(tenant, "viewer", f"bot{i}-{k}")
    @app.step()
    def inc(x: int) -> int:
        return x + 1

    @app.workflow(name="long")
    def long(ctx: cairn.Context, n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    app.run(long, 8, run_id="a-hot", tenant="a")  # a hot run, last, longer than a page of its rows
    return app, Reads(app.store)


def test_a_page_reads_what_it_shows_first_or_deep(place: str) -> None:
    app, reads = made(place)
    want = whole_log(app, "a")
    assert sum(e.kind == "run" for e in want) > RUNS * 3
    assert sum(e.kind == "token" for e in want) == RUNS * MINTED
    since = want[len(want) // 2].at
    for newest in (True, False):
        ordered = want[::-1] if newest else want
        middle = len(ordered) // 2
        # the first page, a deep one, the first since a time (oldest first, where the reads start)
        everything = LogFilter(tenant="a")
        for wanted, after in ((everything, None), (everything, position(ordered[middle])),
                              (LogFilter(tenant="a", since=since), None)):
            reads.reset()
            page = app.audit.log_page(wanted, LIMIT, newest=newest,
                                      after=None if after is None else cursor_of(after))
            start = 0 if after is None else middle + 1
            kept = [e for e in ordered if wanted.since is None or e.at >= wanted.since]
            assert page.entries == kept[start:start + LIMIT]
            shown = {e.run_id for e in page.entries if e.kind == "run"} - HOT
            # the archives its entries come from, and at most the next one the merge reached
            assert shown <= {run for _, run in reads.opened}
            assert len(reads.opened) <= len(shown) + 1, (newest, wanted, after, reads.opened)
            assert {tenant for tenant, _ in reads.opened} <= {"a"}
            assert reads.operator() <= LIMIT + 1, reads.rows  # one statement's page: limit + 1
            # the hot runs its entries come from, and at most the next one; a page of each
            shown_hot = {e.run_id for e in page.entries if e.kind == "run"} & HOT
            assert reads.hot_runs() <= len(shown_hot) + 1, (newest, wanted, after, reads.calls)
            assert reads.hot() <= reads.hot_runs() * (LIMIT + 1), reads.rows
    app.close()


@pytest.mark.parametrize("newest", [True, False], ids=["newest", "oldest"])
def test_pages_put_together_are_the_whole_log_with_each_filter(place: str, newest: bool) -> None:
    app, reads = made(place)
    # an archive made before its range was recorded (migration 0031 / 0047): read by every page
    Raw(place)("UPDATE run_archives SET first_at = NULL, last_at = NULL WHERE run_id = 'a05'")
    want = whole_log(app, "a")
    runs = [e for e in want if e.kind == "run"]
    middle = want[len(want) // 2].at
    filters: list[tuple[LogFilter, Callable[[AuditEvent], bool]]] = [
        (LogFilter(tenant="a"), lambda e: True),
        (LogFilter(tenant="a", kind="token"), lambda e: e.kind == "token"),
        (LogFilter(tenant="a", kind="run"), lambda e: e.kind == "run"),
        (LogFilter(tenant="a", event="run."), lambda e: e.event.startswith("run.")),
        (LogFilter(tenant="a", actor="worker:"), lambda e: "worker:" in e.actor),
        (LogFilter(tenant="a", since=middle), lambda e: e.at >= middle),
        (LogFilter(tenant="a", run_id="a05"), lambda e: e.run_id == "a05"),
    ]
    for wanted, keep in filters:
        expected = [e for e in want if keep(e)]
        assert expected, wanted
        assert paged(app, wanted, 3, newest) == (expected[::-1] if newest else expected), wanted
    assert {e.run_id for e in runs} >= {f"a{i:02d}" for i in range(RUNS)}
    assert {tenant for tenant, _ in reads.opened} == {"a"}
    # the hot rows a few at a time (a run's read in pages of its own), and every tenant's log at once
    hot = [position(e) for e in runs if e.run_id in HOT]
    rows = app.store.audit_log_rows(tenant="a", page=2, newest=newest)  # type: ignore[attr-defined]
    assert [(float(r[3]), str(r[0]), int(r[1])) for r in rows] == (hot[::-1] if newest else hot)
    everyone = whole_log(app, None)
    assert {e.tenant for e in everyone} >= {"a", "b"}
    assert paged(app, LogFilter(), 7, newest) == (everyone[::-1] if newest else everyone)
    app.close()


def test_another_tenants_archives_and_records_are_never_read_whatever_the_cursor(place: str) -> None:
    app, reads = made(place)
    theirs = whole_log(app, "b")
    mine = whole_log(app, "a")
    crafted = [position(e) for e in theirs[:: max(1, len(theirs) // 6)]]  # b's runs' and chain's positions
    # at the very time of one of a's operator records, in a chain before a's and after it (a tie the
    # records' (at, seq) keyset must place by the chain ids' order)
    record = next(e for e in mine[len(mine) // 2:] if e.kind == "token")
    crafted += [(record.at, chain_id("0"), record.seq), (record.at, chain_id("b"), record.seq)]
    for where in crafted:
        for newest in (True, False):
            page = app.audit.log_page(LogFilter(tenant="a"), LIMIT, after=cursor_of(where), newest=newest)
            assert {e.tenant for e in page.entries} <= {"a"}
            assert all(not e.run_id.startswith("b") for e in page.entries)
            # the page is a's entries past the place the cursor names, as a's log orders them
            past = [e for e in (mine[::-1] if newest else mine)
                    if (position(e) < where if newest else position(e) > where)]
            assert page.entries == past[:LIMIT]
    assert {tenant for tenant, _ in reads.opened} == {"a"}
    assert app.audit.log(tenant="b") == theirs
    app.close()
