"""What holds event streams to their token and their order, on SQLite and PostgreSQL:

- revoking a token closes the streams it opened (and a reconnect is 401);
- a token holds a bounded number of streams (429 beyond it);
- a tenant's streams share one reader of the store, as a run's do;
- a run's last entry always precedes its ``end`` (the status is read first);
- the tenant stream holds back changes younger than the settle window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.timing import SLACK

from .conftest import OTHER, TENANT, LiveServer, Setup
from .sse import Event, events


def _feeds(server: LiveServer, kind: str) -> dict[str, Any]:
    found: dict[str, Any] = server.server.config.app.state.cairn.extra.get(kind, {})
    return found


def _wait_for(condition: Any, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds * SLACK
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def _next_change(stream: Iterator[Event]) -> str:
    """The run of the next change on a tenant stream (within 25 heartbeats)."""
    for beats, event in enumerate(stream):
        assert beats < 25, "no change came"
        if not event.comment:
            return str(event.data["run"]["run_id"])
    raise AssertionError("the stream ended")


def _until_closed(stream: Iterator[Event], revoke: Any) -> list[Event]:
    """Read a stream; revoke its token at the first heartbeat; the events
    from then on, which must end (at most 20 heartbeats later)."""
    after: list[Event] = []
    revoked = False
    for event in stream:
        if not revoked:
            if event.comment:
                revoke()
                revoked = True
            continue
        after.append(event)
        assert sum(e.comment for e in after) <= 20, "the stream of a revoked token goes on"
    assert revoked
    return after


@pytest.mark.parametrize("path", ["run", "tenant"])
def test_revoking_a_token_closes_the_streams_it_opened(setup: Setup, server: LiveServer, path: str) -> None:
    minted = setup.app.tokens.mint(TENANT, "viewer", "watcher")
    run_id = setup.app.start(setup.workflows["echo"], "idle", tenant=TENANT).run_id  # no worker: pending
    url = f"/api/runs/{run_id}/events?after=1" if path == "run" else "/api/events"
    headers = {"Authorization": f"Bearer {minted.secret}"}
    with httpx.Client(base_url=server.url, timeout=30, headers=headers) as http:
        with http.stream("GET", url) as response:
            assert response.status_code == 200
            after = _until_closed(events(response), lambda: setup.app.tokens.revoke(minted.record.token_id))
        final = [e for e in after if not e.comment and e.event != "run.changed"]
        assert [e.event for e in final] == ["revoked"], after
        assert final[0].data["error"] == "unauthorized"
        again = http.get(url)
        assert again.status_code == 401


def test_a_token_holds_a_bounded_number_of_streams(setup: Setup) -> None:
    run_id = setup.app.start(setup.workflows["echo"], "idle", tenant=TENANT).run_id
    with LiveServer(setup.app, heartbeat=0.2, max_streams=2) as live, \
            httpx.Client(base_url=live.url, timeout=30, headers=setup.headers("viewer")) as http:
        with http.stream("GET", "/api/events") as first, \
                http.stream("GET", f"/api/runs/{run_id}/events?after=1") as second:
            assert (first.status_code, second.status_code) == (200, 200)
            third = http.get("/api/events")
            assert third.status_code == 429, third.text
            assert third.json()["error"] == "too_many_streams"
            assert "2 event streams" in third.json()["message"]
            with http.stream("GET", "/api/events", headers=setup.headers("operator")) as others:
                assert others.status_code == 200  # the cap is the token's, not the tenant's
        held = live.server.config.app.state.cairn.extra["streams"]
        _wait_for(lambda: not held, "the server to let the closed streams go")
        with http.stream("GET", "/api/events") as again:
            assert again.status_code == 200


def test_a_tenants_streams_share_one_reader_and_each_gets_every_change(
        setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    app, echo = setup.app, setup.workflows["echo"]
    before = [app.start(echo, f"before {i}", tenant=TENANT).run_id for i in range(3)]
    app.start(echo, "theirs", tenant=OTHER)
    reads: list[str] = []
    runs_changed = app.runs_changed

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = runs_changed(*args, **kwargs)
        reads.extend(r.run_id for r in found)
        return found

    monkeypatch.setattr(app, "runs_changed", counted)
    got: dict[int, list[str]] = {}
    cursors: dict[int, str] = {}
    failures: list[BaseException] = []
    with LiveServer(app, heartbeat=0.2) as live, \
            httpx.Client(base_url=live.url, timeout=30, headers=setup.headers("viewer")) as http:
        with http.stream("GET", "/api/events") as response:  # the first run's cursor
            cursor = next(e.id for e in events(response) if not e.comment)
        assert cursor is not None
        cursors = {0: "", 1: "", 2: cursor, 3: cursor}

        seen_by: dict[int, list[str]] = {i: [] for i in range(4)}

        def subscribe(index: int, want: int) -> None:
            seen = seen_by[index]
            try:
                headers = {"Last-Event-ID": cursors[index]} if cursors[index] else {}
                with http.stream("GET", "/api/events", headers=headers) as response:
                    for event in events(response):
                        if not event.comment:
                            seen.append(event.data["run"]["run_id"])
                        if len(seen) == want:
                            break
            except BaseException as exc:
                failures.append(exc)
            got[index] = seen

        threads = [threading.Thread(target=subscribe, args=(i, 4 if i < 2 else 3)) for i in range(4)]
        for t in threads:
            t.start()
        feeds = _feeds(live, "tenant_feeds")
        _wait_for(lambda: TENANT in feeds and feeds[TENANT].subscribers == 4, "four subscribers")
        # A subscriber counts from its first look, but one behind the feed's start (a stream from
        # the beginning, come after a feed begun at the cursor had read) reads the store itself
        # until it passes it: only once every stream has had what came before is the feed the
        # one reader (started earlier, such a read sees the new change too: load 5-10 did it)
        _wait_for(lambda: failures or all(len(seen_by[i]) == (3 if i < 2 else 2) for i in range(4)),
                  "every stream to have the changes before")
        reads.clear()
        new = app.start(echo, "new", tenant=TENANT).run_id
        for t in threads:
            t.join(30)
        assert not failures, failures
        assert got[0] == got[1] == [*before, new]
        assert got[2] == got[3] == [*before[1:], new]
        assert reads.count(new) == 1, f"{reads.count(new)} reads of the store saw the change, not one"
        _wait_for(lambda: not feeds, "the tenant's reader to stop with its last subscriber")


def test_the_last_entry_always_precedes_end(setup: Setup, server: LiveServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The run ends (an entry and the terminal status in one transaction)
    between the feed's two reads of a look: read the entries first and the
    status second, and the feed sends ``end`` without that last entry."""
    app = setup.app
    run_id = app.start(setup.workflows["echo"], "ends soon", tenant=TENANT).run_id
    armed = threading.Event()
    history = app.history

    def then_cancel(*args: Any, **kwargs: Any) -> Any:
        found = history(*args, **kwargs)
        if armed.is_set() and args and args[0] == run_id:
            armed.clear()
            app.cancel(run_id, "ended between two reads")
        return found

    monkeypatch.setattr(app, "history", then_cancel)
    seen: list[int] = []
    end: dict[str, Any] = {}
    with httpx.Client(base_url=server.url, timeout=30, headers=setup.headers("viewer")) as http, \
            http.stream("GET", f"/api/runs/{run_id}/events") as response:
        for event in events(response):
            if event.event == "end":
                end = event.data
                break
            if event.comment:
                continue
            seen.append(int(event.id or -1))
            if len(seen) == 1:
                armed.set()
            assert len(seen) < 100
    last = [e.seq for e in history(run_id)]
    assert app.get_run(run_id).status.value == "cancelled"
    assert seen == last, "an entry written as the run ended was left out"
    assert end["last_seq"] == last[-1]


def test_the_tenant_stream_holds_back_changes_younger_than_the_settle_window(setup: Setup) -> None:
    app, echo = setup.app, setup.workflows["echo"]
    first = app.start(echo, "first", tenant=TENANT).run_id
    stamp = app.get_run(first).updated_at
    while app.store.clock() <= stamp:  # the next change is stamped later
        time.sleep(0.001)
    later = app.start(echo, "later", tenant=TENANT).run_id
    assert [r.run_id for r in app.store.runs_changed(TENANT, (0.0, ""), stamp, 10)] == [first]
    assert [r.run_id for r in app.store.runs_changed(TENANT, (0.0, ""), float("inf"), 10)] == [first, later]
    assert app.runs_changed(TENANT, settle=3600) == []
    with LiveServer(app, heartbeat=0.1, settle=3600) as live, \
            httpx.Client(base_url=live.url, timeout=30, headers=setup.headers("viewer")) as http, \
            http.stream("GET", "/api/events") as response:
        for beats, event in enumerate(events(response), 1):
            assert event.comment, f"a change younger than the settle window was sent: {event}"
            if beats == 5:
                break


def test_a_tenant_subscriber_behind_the_shared_reader_catches_up_from_the_store(
        setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader keeps 3 changes (``CACHE``): a subscriber arriving after
    it trimmed reads the store until it passes the reader, then joins it;
    either way each subscriber gets every change after its cursor once."""
    from cairn.server import events as events_module

    monkeypatch.setattr(events_module, "CACHE", 3)
    app, echo = setup.app, setup.workflows["echo"]
    before = [app.start(echo, f"before {i}", tenant=TENANT).run_id for i in range(8)]
    with LiveServer(app, heartbeat=0.2) as live, \
            httpx.Client(base_url=live.url, timeout=30, headers=setup.headers("viewer")) as http, \
            http.stream("GET", "/api/events") as first:
        first_events = events(first)
        seen = [_next_change(first_events) for _ in before]
        assert seen == before
        feed = _feeds(live, "tenant_feeds")[TENANT]
        assert len(feed.keys) == 3
        with http.stream("GET", "/api/events") as second:
            second_events = events(second)
            late = [_next_change(second_events) for _ in before]
            assert late == before
            new = app.start(echo, "new", tenant=TENANT).run_id
            assert _next_change(second_events) == new
            assert _next_change(first_events) == new
