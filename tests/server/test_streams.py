"""Event streams survive reconnects: 0 gaps and 0 duplicates over many
random disconnects while the run keeps producing, on SQLite and PostgreSQL;
``Last-Event-ID`` wins over ``?after=``; heartbeats on idle streams; the
tenant stream pages by ``(updated_at, run_id)`` and shows no other tenant."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import httpx
import pytest

from cairn.server import events as events_module
from tests.timing import SLACK

from .conftest import OTHER, TENANT, LiveServer, Setup
from .sse import events


def _worker(setup: Setup, stop: threading.Event) -> threading.Thread:
    worker = setup.app.worker(concurrency=2, poll_interval=0.01)

    def serve() -> None:
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        stop.wait()
        worker.stop()
        thread.join(15)

    runner = threading.Thread(target=serve, daemon=True)
    runner.start()
    return runner


def test_random_disconnects_lose_and_repeat_nothing_while_the_run_produces(
        setup: Setup, server: LiveServer) -> None:
    rng = random.Random(1313)
    handle = setup.app.start(setup.workflows["slow_ticker"], 100, tenant=TENANT)
    stop = threading.Event()
    runner = _worker(setup, stop)
    seen: list[int] = []
    reconnects = while_running = 0
    ended = False
    deadline = time.monotonic() + 60 * SLACK
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers=setup.headers("viewer")) as http:
            while not ended and time.monotonic() < deadline:
                headers = {"Last-Event-ID": str(seen[-1])} if seen else {}
                take = rng.randint(1, 12)
                with http.stream("GET", f"/api/runs/{handle.run_id}/events", headers=headers) as response:
                    assert response.status_code == 200
                    for event in events(response):
                        if event.comment:
                            continue
                        if event.event == "end":
                            ended = True
                            break
                        seen.append(int(event.id or -1))
                        assert event.data["seq"] == seen[-1]
                        take -= 1
                        if take == 0:
                            break  # hang up mid-stream, as a flaky network does
                reconnects += 1
                while_running += not setup.app.get_run(handle.run_id).status.terminal
    finally:
        stop.set()
        runner.join(20)
    assert ended, "the stream never said the run ended"
    history = [e.seq for e in setup.app.history(handle.run_id)]
    assert seen == history, "gaps or duplicates across reconnects"
    assert len(set(seen)) == len(seen)
    assert len(seen) > 100
    assert while_running >= 10, f"only {while_running} reconnects happened while the run produced"


def test_last_event_id_wins_over_after_and_resumes_exactly(setup: Setup, server: LiveServer) -> None:
    result = setup.app.run(setup.workflows["ticker"], 5, tenant=TENANT)
    assert result == 10
    run = setup.app.list_runs(tenant=TENANT)[0]
    total = [e.seq for e in setup.app.history(run.run_id)]
    with httpx.Client(base_url=server.url, timeout=30, headers=setup.headers("viewer")) as http:
        def read(path: str, **headers: str) -> list[int]:
            with http.stream("GET", path, headers=headers) as response:
                return [int(e.id or -1) for e in events(response) if not e.comment and e.event != "end"]

        assert read(f"/api/runs/{run.run_id}/events") == total
        assert read(f"/api/runs/{run.run_id}/events?after=4") == total[4:]
        assert read(f"/api/runs/{run.run_id}/events?after=2", **{"Last-Event-ID": "6"}) == total[6:]
        assert read(f"/api/runs/{run.run_id}/events?after={total[-1]}") == []
        bad = http.get(f"/api/runs/{run.run_id}/events", headers={"Last-Event-ID": "-1"})
        assert bad.status_code == 400
        assert bad.json()["error"] == "invalid"


def test_an_idle_stream_sends_heartbeats(setup: Setup, server: LiveServer) -> None:
    handle = setup.app.start(setup.workflows["echo"], "waiting", tenant=TENANT)  # no worker: stays pending
    beats = 0
    with httpx.Client(base_url=server.url, timeout=30, headers=setup.headers("viewer")) as http, \
            http.stream("GET", f"/api/runs/{handle.run_id}/events?after=1") as response:
        for event in events(response):
            assert event.comment, f"an idle run produced {event}"
            beats += 1
            if beats == 2:
                break
    assert beats == 2


def test_the_tenant_stream_resumes_after_its_cursor_and_shows_no_other_tenant(setup: Setup) -> None:
    settle = 0.3  # changes younger than this are held back (the PostgreSQL commit-order margin)
    mine = [setup.app.start(setup.workflows["echo"], f"mine {i}", tenant=TENANT).run_id for i in range(3)]
    theirs = setup.app.start(setup.workflows["echo"], "theirs", tenant=OTHER).run_id
    with LiveServer(setup.app, heartbeat=0.2, settle=settle) as server, \
            httpx.Client(base_url=server.url, timeout=30, headers=setup.headers("viewer")) as http:
        def read(count: int, **headers: str) -> list[tuple[str, str]]:
            got: list[tuple[str, str]] = []
            started = time.monotonic()
            with http.stream("GET", "/api/events", headers=headers) as response:
                for event in events(response):
                    if event.comment and time.monotonic() - started > settle + 0.5:
                        break  # idle past the settle time: everything there is was sent
                    if event.comment:
                        continue
                    got.append((event.id or "", event.data["run"]["run_id"]))
                    if len(got) == count:
                        break
            return got

        first = read(3)
        assert [run for _, run in first] == mine
        assert theirs not in {run for _, run in first}
        cancelled = setup.app.cancel(mine[1])
        assert cancelled.status.value == "cancelled"
        after = read(1, **{"Last-Event-ID": first[-1][0]})
        assert [run for _, run in after] == [mine[1]]
        assert read(5, **{"Last-Event-ID": after[-1][0]}) == []
        bad = http.get("/api/events", headers={"Last-Event-ID": "nonsense"})
        assert bad.status_code == 400


def test_concurrent_subscribers_share_one_feed_and_each_gets_exactly_its_entries(
        setup: Setup, server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Subscribers of one run share one reader (``RunFeed``); a cache of 5
    entries forces those behind it back to the store, and random hang-ups
    move them back and forth between the two paths."""
    monkeypatch.setattr(events_module, "CACHE", 5)
    handle = setup.app.start(setup.workflows["slow_ticker"], 60, tenant=TENANT)
    stop = threading.Event()
    runner = _worker(setup, stop)
    results: dict[int, tuple[int, list[int]]] = {}
    failures: list[BaseException] = []

    def subscriber(index: int) -> None:
        rng = random.Random(index)
        start = rng.choice([0, 0, 3, 10, 25])
        seen: list[int] = []
        try:
            with httpx.Client(base_url=server.url, timeout=30, headers=setup.headers("viewer")) as http:
                ended = False
                deadline = time.monotonic() + 60 * SLACK
                while not ended and time.monotonic() < deadline:
                    cursor = seen[-1] if seen else start
                    take = rng.randint(1, 20)
                    with http.stream("GET", f"/api/runs/{handle.run_id}/events",
                                     headers={"Last-Event-ID": str(cursor)}) as response:
                        for event in events(response):
                            if event.comment:
                                continue
                            if event.event == "end":
                                ended = True
                                break
                            seen.append(int(event.id or -1))
                            take -= 1
                            if take == 0:
                                break
            results[index] = (start, seen)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=subscriber, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
    finally:
        stop.set()
        runner.join(20)
    assert not failures, failures
    history = [e.seq for e in setup.app.history(handle.run_id)]
    assert len(results) == 8
    feeds = server.server.config.app.state.cairn.extra.get("feeds", {})
    deadline = time.monotonic() + 5 * SLACK
    while feeds and time.monotonic() < deadline:  # the last hang-up stops the run's reader
        time.sleep(0.05)
    assert feeds == {}
    for start, seen in results.values():
        assert seen == [s for s in history if s > start], "a subscriber missed or repeated entries"


def test_a_cursor_past_the_end_does_not_stall_the_other_subscribers(setup: Setup, server: LiveServer) -> None:
    """A subscriber claiming to have seen entries the run never wrote gets
    nothing but the end (at the run's real last entry), and the run's shared
    feed does not begin past the end: a subscriber with an honest cursor on
    the same run meanwhile gets every entry and the end."""
    handle = setup.app.start(setup.workflows["slow_ticker"], 40, tenant=TENANT)
    liar_opened = threading.Event()
    liar: list[Any] = []

    def lie() -> None:
        with httpx.Client(base_url=server.url, timeout=60, headers=setup.headers("viewer")) as http, \
                http.stream("GET", f"/api/runs/{handle.run_id}/events",
                            headers={"Last-Event-ID": "1000000"}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("retry:")  # sent once the run's feed exists
            liar_opened.set()
            ending = False
            for line in lines:
                if line == "event: end":
                    ending = True
                elif ending and line.startswith("data: "):
                    liar.append(json.loads(line[6:]))
                    return

    lying = threading.Thread(target=lie, daemon=True)
    lying.start()
    assert liar_opened.wait(30)
    stop = threading.Event()
    runner = _worker(setup, stop)
    seen: list[int] = []
    ended = False
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers=setup.headers("viewer")) as http, \
                http.stream("GET", f"/api/runs/{handle.run_id}/events") as response:
            deadline = time.monotonic() + 30 * SLACK
            for event in events(response):
                assert time.monotonic() < deadline, "the honest subscriber never got the end"
                if event.event == "end":
                    ended = True
                    break
                if not event.comment:
                    seen.append(int(event.id or -1))
    finally:
        stop.set()
        runner.join(20)
        lying.join(30)
    assert ended
    history = [e.seq for e in setup.app.history(handle.run_id)]
    assert seen == history
    assert liar, "the subscriber with a cursor past the end never got the end"
    assert liar[0]["last_seq"] == history[-1]
