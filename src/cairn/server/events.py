"""Event streams as Server-Sent Events, resumable without gaps or duplicates.

**A run's stream** (``GET /api/runs/{id}/events``) is its history: each event's
``id`` is the entry's ``seq``. A run's history is gap-free and append-only, and
its entries commit in ``seq`` order (the fenced append requires ``seq = max +
1`` in the committing transaction), so a reader that asks for ``seq > N`` sees
a prefix of what comes after N, never a hole that fills later. A client
reconnecting with ``Last-Event-ID: N`` (what browsers send by themselves; or
``?after=N``, the header winning) therefore gets exactly the entries after N.
When the run has ended and everything was sent, an ``end`` event closes the
stream.

**A tenant's stream** (``GET /api/events``) is the latest state of each of the
tenant's runs as it changes, ordered by ``(updated_at, run_id)``; the ``id`` is
that pair (``<updated_at>/<run_id>``), an index of ``runs`` serves the page.
We chose it over a new global sequence on ``history``: that column would need
an index written by every step (the one-row-per-step cost the journal is
designed around), and a database sequence is not commit-ordered on
PostgreSQL (a reader could pass a number whose transaction commits later).
On SQLite writers are serialised and stamp ``updated_at`` once they hold the
write lock, so the order is commit order. On PostgreSQL a change is stamped
before its transaction commits; the stream holds back changes younger than
``settle`` seconds (default 2), so one is skipped only if its transaction took
longer than that to commit. Changes of one run between two reads collapse into
its latest state; every entry is in the run's own stream. A tenant's streams
share one reader per server (``TenantFeed``), as a run's do (``RunFeed``).

**Tokens.** A stream looks at its token again once a heartbeat interval (one
read per token, however many streams it holds): once revoked, its streams
send a ``revoked`` event and end, and a reconnect is a 401. A token holds at
most ``max_streams`` streams at once (default 32); one more is a 429.

**Waiting.** When the store notifies (``App.listen_for_changes``: PostgreSQL's
``LISTEN``; SQLite once it offers a ``Notifier``), a stream wakes at once;
without a notification it looks again after a backoff (50 ms doubling to
``max_poll``, back to 50 ms after it found something), so an idle stream
costs a few reads a second, not a busy loop. Heartbeats (comment lines) go
out after ``heartbeat`` idle seconds, so proxies keep idle streams open.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cairn.api.app import App
from cairn.api.tokens import Principal, Role
from cairn.api.views import ModelCalls, event_json, model_calls_of, run_json
from cairn.server.errors import ApiError, log
from cairn.server.routing import Endpoint, ServerState, tenant_run
from cairn.store.records import HistoryEvent, RunRecord

MIN_POLL = 0.05
BATCH = 500
#: entries a run's feed keeps for its subscribers (those further behind read the store)
CACHE = 10_000
#: entries sent to a subscriber in one write (each write costs the server a
#: send; a bound keeps 1,000 subscribers' joined strings small)
WRITE = 64
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Wakeup:
    """Wakes every waiting stream of one server when the store notifies."""

    def __init__(self) -> None:
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None
        self.notifying = False

    def start(self, state: ServerState) -> None:
        stop = state.app.listen_for_changes(self.notify)
        self._stop = stop
        self.notifying = stop is not None

    def close(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout: float) -> None:
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(entry)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(entry)


def wakeup_of(state: ServerState) -> Wakeup:
    """The server's ``Wakeup``, listening from the first stream on (a server
    mounted in another app gets no lifespan events of its own)."""
    found = state.extra.get("wakeup")
    if not isinstance(found, Wakeup):
        found = Wakeup()
        state.extra["wakeup"] = found
        found.start(state)
    return found


def sse(data: dict[str, Any], *, id: str | None = None, event: str | None = None) -> str:
    """One Server-Sent Event. JSON never holds a raw newline, so ``data`` is one line."""
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


def _cursor_text(request: Request) -> str | None:
    last = request.headers.get("last-event-id")
    if last is not None and last.strip():
        return last.strip()
    return request.query_params.get("after")


def run_cursor(request: Request) -> int:
    raw = _cursor_text(request)
    if raw is None or raw == "":
        return 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ApiError(400, "invalid", f"the cursor (Last-Event-ID or after) must be a sequence number, "
                                       f"not {raw[:40]!r}")
    return int(raw)


def tenant_cursor(request: Request) -> tuple[float, str]:
    raw = _cursor_text(request)
    if raw is None or raw == "":
        return (0.0, "")
    at, slash, run_id = raw.partition("/")
    try:
        value = float(at)
    except ValueError:
        value = math.nan
    if not slash or not math.isfinite(value) or len(raw) > 400:
        raise ApiError(400, "invalid", f"the cursor (Last-Event-ID or after) must read "
                                       f"'<updated_at>/<run_id>', not {raw[:40]!r}")
    return (value, run_id)


class _Pace:
    """The backoff between two looks at the store, and the heartbeat clock."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.delay = MIN_POLL
        self.idle = 0.0

    def found(self) -> None:
        self.delay = MIN_POLL
        self.idle = 0.0

    async def wait(self) -> bool:
        """Wait for a notification or the backoff; true when a heartbeat is due."""
        wait = min(self.delay, max(self.state.heartbeat - self.idle, 0.0))
        await wakeup_of(self.state).wait(wait)
        self.idle += wait
        self.delay = min(self.delay * 2, self.state.max_poll)
        if self.idle >= self.state.heartbeat:
            self.idle = 0.0
            return True
        return False


class _Guard:
    """A stream's token, looked at again once a heartbeat interval: a
    revoked token's streams end (with a ``revoked`` event) instead of
    delivering on. One look at the store per token and interval, however
    many streams the token holds (``state.extra["token_checks"]``)."""

    def __init__(self, state: ServerState, principal: Principal) -> None:
        self.state = state
        self.token_id = principal.token_id
        self.due = time.monotonic() + state.heartbeat

    async def revoked(self) -> bool:
        now = time.monotonic()
        if now < self.due:
            return False
        self.due = now + self.state.heartbeat
        checks: dict[str, tuple[float, bool]] = self.state.extra.setdefault("token_checks", {})
        checked = checks.get(self.token_id)
        if checked is None or now - checked[0] >= self.state.heartbeat:
            try:
                live = await run_in_threadpool(self.state.app.tokens.live, self.token_id)
            except Exception as exc:  # the store is down: the stream waits for it, as its reads do
                log.warning("cannot look at token %s again: %s", self.token_id, exc)
                return False
            checked = checks[self.token_id] = (now, live)
        return not checked[1]


REVOKED = sse({"error": "unauthorized", "message": "the token was revoked"}, event="revoked")


class _Held:
    """A stream's body, holding one of its token's stream slots until it
    ends, fails or is dropped (a client that hangs up before the first
    event never starts it, so ``__del__`` gives the slot back too)."""

    def __init__(self, state: ServerState, token_id: str, body: AsyncIterator[str]) -> None:
        self.open = False
        held: dict[str, int] = state.extra.setdefault("streams", {})
        if held.get(token_id, 0) >= state.max_streams:
            raise ApiError(429, "too_many_streams", f"this token holds {state.max_streams} event streams "
                                                    "already, the most one token may; close one first")
        held[token_id] = held.get(token_id, 0) + 1
        self.held, self.token_id, self.body = held, token_id, body
        self.open = True

    def __aiter__(self) -> _Held:
        return self

    async def __anext__(self) -> str:
        try:
            return await self.body.__anext__()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self.open:
            self.open = False
            left = self.held.get(self.token_id, 1) - 1
            if left > 0:
                self.held[self.token_id] = left
            else:
                self.held.pop(self.token_id, None)

    def __del__(self) -> None:
        self.release()


def _streaming(state: ServerState, principal: Principal, body: AsyncIterator[str]) -> Response:
    return StreamingResponse(_Held(state, principal.token_id, body), media_type="text/event-stream",
                             headers=_HEADERS)


def _render(app: App, run_id: str, events: list[HistoryEvent]) -> list[tuple[int, str]]:
    """``(seq, SSE text)`` of history entries (a model call is rebuilt from
    the entries it names as needed: an entry stores only what was new)."""
    models: ModelCalls = model_calls_of(app, app.runtime.payloads, run_id, events)
    return [(e.seq, sse(event_json(app.runtime.payloads, e, models), id=str(e.seq))) for e in events]


class RunFeed:
    """One run's entries read once for every subscriber of this server.

    A single task per run and server reads the store (so 1,000 subscribers
    cost one read per look, not 1,000) and keeps the entries it read, in
    ``seq`` order and without holes, as ``seq`` ``base + 1 .. last``. A
    subscriber whose cursor is behind ``base`` (it reconnected from far back,
    or the cache was trimmed) reads the store directly until it is within
    the cache; from there it is served from the cache. Either way it gets
    each ``seq`` after its cursor exactly once.
    """

    def __init__(self, state: ServerState, run_id: str, base: int) -> None:
        self.state = state
        self.run_id = run_id
        self.base = base
        self.entries: list[tuple[int, str]] = []
        self.end: str | None = None
        self.changed = asyncio.Event()
        self.subscribers = 0
        self.task: asyncio.Task[None] | None = None

    @property
    def last(self) -> int:
        return self.entries[-1][0] if self.entries else self.base

    def _notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def poll(self) -> None:
        app, pace = self.state.app, _Pace(self.state)
        while True:
            try:
                # the status before the entries: once terminal, this read holds every entry
                record = await run_in_threadpool(app.get_run, self.run_id)
                events = await run_in_threadpool(app.history, self.run_id, self.last, BATCH)
            except Exception as exc:  # the store is down, the run was pruned: look again later
                log.warning("event feed of run %r: %s", self.run_id, exc)
                await asyncio.sleep(self.state.max_poll)
                continue
            if events:
                self.entries.extend(await run_in_threadpool(_render, app, self.run_id, events))
                if len(self.entries) > CACHE:
                    dropped = len(self.entries) - CACHE
                    self.base = self.entries[dropped - 1][0]
                    del self.entries[:dropped]
                self.end = None
                self._notify()
                pace.found()
                if len(events) == BATCH:
                    continue
            elif record.status.terminal and self.end is None:
                self.end = sse({"run_id": self.run_id, "status": record.status.value, "last_seq": self.last},
                               event="end")
                self._notify()
            await pace.wait()


def _feed(state: ServerState, run_id: str, cursor: int) -> RunFeed:
    feeds: dict[str, RunFeed] = state.extra.setdefault("feeds", {})
    feed = feeds.get(run_id)
    if feed is None:
        feed = feeds[run_id] = RunFeed(state, run_id, cursor)
        feed.task = asyncio.get_running_loop().create_task(feed.poll())
    feed.subscribers += 1
    return feed


def _unsubscribe(state: ServerState, table: str, key: str, feed: RunFeed | TenantFeed) -> None:
    """One subscriber fewer on ``feed`` (``state.extra[table][key]``); the
    last one stops its poller and forgets it (run and tenant feeds alike)."""
    feed.subscribers -= 1
    if feed.subscribers == 0:
        state.extra.get(table, {}).pop(key, None)
        if feed.task is not None:
            feed.task.cancel()


def _within(app: App, run_id: str, cursor: int) -> int:
    """Where a new feed of the run may begin for a subscriber at ``cursor``:
    the cursor, or the run's last ``seq`` if the cursor is past it. The
    subscriber still gets only entries after its cursor, but the feed, shared
    by every subscriber of the run, must not begin past entries that exist:
    it would never read them, and the others would wait for them, and for an
    ``end``, forever."""
    if cursor == 0 or app.history(run_id, cursor - 1, 1):
        return cursor
    history = app.history(run_id)
    return history[-1].seq if history else 0


async def run_events(request: Request, state: ServerState, principal: Principal) -> Response:
    run_id = request.path_params["run_id"]
    after = run_cursor(request)
    app = state.app

    await run_in_threadpool(tenant_run, app, principal, run_id)
    start = await run_in_threadpool(_within, app, run_id, after)

    async def stream() -> AsyncIterator[str]:
        cursor = after
        feed = _feed(state, run_id, start)
        guard = _Guard(state, principal)
        try:
            yield "retry: 1000\n\n"
            while True:
                if await guard.revoked():
                    yield REVOKED
                    return
                if cursor < feed.base:  # behind the cache: straight from the store
                    gap = min(BATCH, feed.base - cursor)
                    events = await run_in_threadpool(app.history, run_id, cursor, gap)
                    if events:
                        rendered = await run_in_threadpool(_render, app, run_id, events)
                        yield "".join(text for _, text in rendered)
                        cursor = rendered[-1][0]
                        continue
                index = cursor - feed.base  # entries[index] holds seq cursor + 1
                if 0 <= index < len(feed.entries):
                    # the entries ready in one write (up to WRITE): a subscriber
                    # costs the server a send per look at the store, not one per
                    # entry (1,000 subscribers of a busy run: see bench/server.py)
                    ready = feed.entries[index:index + WRITE]
                    yield "".join(text for _, text in ready)
                    cursor = ready[-1][0]
                    continue
                if feed.end is not None and cursor >= feed.last:
                    yield feed.end
                    return
                changed = feed.changed
                try:
                    await asyncio.wait_for(changed.wait(), state.heartbeat)
                except TimeoutError:
                    yield ": heartbeat\n\n"
        finally:
            _unsubscribe(state, "feeds", feed.run_id, feed)

    return _streaming(state, principal, stream())


class TenantFeed:
    """One tenant's changes read once for every subscriber of this server
    (as ``RunFeed`` does for a run: 1,000 dashboards of a tenant cost one
    read per look, not 1,000).

    The feed reads ``runs_changed`` from ``base`` on and keeps what it read,
    in cursor order: ``keys[i]`` is the cursor of ``entries[i]``. A
    subscriber at cursor ``c >= base`` is served the entries after ``c``
    (every change after ``base`` is one of them, once read); one behind
    ``base`` reads the store itself until it passes ``base``. A new feed
    begins at its first subscriber's cursor, and moves back to an earlier
    subscriber's while it has read nothing (a cursor claiming the future
    would otherwise leave every honest subscriber reading on its own).
    """

    def __init__(self, state: ServerState, tenant: str, base: tuple[float, str]) -> None:
        self.state = state
        self.tenant = tenant
        self.base = base
        self.keys: list[tuple[float, str]] = []
        self.entries: list[str] = []
        self.changed = asyncio.Event()
        self.subscribers = 0
        self.task: asyncio.Task[None] | None = None

    @property
    def last(self) -> tuple[float, str]:
        return self.keys[-1] if self.keys else self.base

    def _notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def poll(self) -> None:
        pace = _Pace(self.state)
        while True:
            start = self.last
            try:
                changed = await run_in_threadpool(_changes, self.state, self.tenant, start)
            except Exception as exc:  # the store is down: look again later
                log.warning("event feed of tenant %r: %s", self.tenant, exc)
                await asyncio.sleep(self.state.max_poll)
                continue
            if self.last != start:  # moved back meanwhile: what was read may skip changes
                continue
            if changed:
                for record in changed:
                    key = (record.updated_at, record.run_id)
                    self.keys.append(key)
                    self.entries.append(_change_event(record))
                if len(self.keys) > CACHE:
                    dropped = len(self.keys) - CACHE
                    self.base = self.keys[dropped - 1]
                    del self.keys[:dropped], self.entries[:dropped]
                self._notify()
                pace.found()
                if len(changed) == BATCH:
                    continue
            await pace.wait()


def _changes(state: ServerState, tenant: str, cursor: tuple[float, str]) -> list[RunRecord]:
    return state.app.runs_changed(tenant, cursor, settle=state.settle, limit=BATCH)


def _change_event(record: RunRecord) -> str:
    return sse({"event": "run.changed", "run": run_json(record)}, id=f"{record.updated_at!r}/{record.run_id}")


def _tenant_feed(state: ServerState, tenant: str, cursor: tuple[float, str]) -> TenantFeed:
    feeds: dict[str, TenantFeed] = state.extra.setdefault("tenant_feeds", {})
    feed = feeds.get(tenant)
    if feed is None:
        feed = feeds[tenant] = TenantFeed(state, tenant, cursor)
        feed.task = asyncio.get_running_loop().create_task(feed.poll())
    elif cursor < feed.base and not feed.keys:
        feed.base = cursor
    feed.subscribers += 1
    return feed



async def tenant_events(request: Request, state: ServerState, principal: Principal) -> Response:
    after = tenant_cursor(request)
    tenant = principal.tenant

    async def stream() -> AsyncIterator[str]:
        cursor = after
        feed = _tenant_feed(state, tenant, after)
        guard = _Guard(state, principal)
        pace = _Pace(state)
        try:
            yield "retry: 1000\n\n"
            while True:
                if await guard.revoked():
                    yield REVOKED
                    return
                if cursor < feed.base:  # behind the feed: straight from the store
                    changed = await run_in_threadpool(_changes, state, tenant, cursor)
                    if changed:
                        yield "".join(_change_event(r) for r in changed)
                        cursor = (changed[-1].updated_at, changed[-1].run_id)
                        pace.found()
                        continue
                    if await pace.wait():
                        yield ": heartbeat\n\n"
                    continue
                index = bisect.bisect_right(feed.keys, cursor)
                if index < len(feed.keys):
                    ready = feed.entries[index:index + WRITE]
                    yield "".join(ready)
                    cursor = feed.keys[index + len(ready) - 1]
                    continue
                try:
                    await asyncio.wait_for(feed.changed.wait(), state.heartbeat)
                except TimeoutError:
                    yield ": heartbeat\n\n"
        finally:
            _unsubscribe(state, "tenant_feeds", feed.tenant, feed)

    return _streaming(state, principal, stream())


ROUTES = [
    Endpoint("GET", "/api/runs/{run_id}/events", Role.VIEWER,
             "The run's history as Server-Sent Events (id = seq; resume with Last-Event-ID or ?after=)",
             stream=run_events, tag="events", media="text/event-stream"),
    Endpoint("GET", "/api/events", Role.VIEWER,
             "The tenant's run changes as Server-Sent Events (id = <updated_at>/<run_id>)",
             stream=tenant_events, tag="events", media="text/event-stream"),
]
