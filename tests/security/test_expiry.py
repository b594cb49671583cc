"""A token that expires while its run sleeps for a (simulated) day, on
SQLite and PostgreSQL, sync and async.

Time is one fake clock for everyone who judges it: the store (runnable
times, leases), ``ctx.sleep`` (``cairn.engine.context`` reads the time
there) and the service that issued the token. Advancing it by a day is a
day for all of them; nothing waits for real.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
import cairn.engine.context
from cairn.engine.executor import execute
from cairn.store.contract import Store
from tests.acceptance.harness import FakeClock
from tests.engine.kinds import Flow, Kind, both
from tests.security.world import Service, Unauthorized, recorded_text

DAY = 86_400.0
API = cairn.Secret("api")

MakeApp = Callable[[cairn.Secrets], cairn.App]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(time.time())
    monkeypatch.setattr(cairn.engine.context, "time", types.SimpleNamespace(time=fake))
    return fake


@pytest.fixture(params=["sqlite", "postgres"])
def make_app(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[MakeApp]:
    """``make_app(secrets)``: an App on the test's database whose store runs
    on ``clock``; each call is another worker process's App (its own store
    connection, runtime and provider caches)."""
    made: list[cairn.App] = []

    def store() -> Store:
        if request.param == "postgres":
            from cairn.store.postgres import PostgresStore

            return PostgresStore(request.getfixturevalue("pg_url"), clock=clock)
        from cairn.store.sqlite import SQLiteStore

        return SQLiteStore(tmp_path / "cairn.db", clock=clock)

    def make(secrets: cairn.Secrets) -> cairn.App:
        app = cairn.App(store=store(), secrets=secrets, lease_seconds=5.0)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def register(app: cairn.App, kind: Kind, service: Service, refresh_on_error: bool) -> Any:
    """The workflow every worker runs: call the service, sleep a day, call it again."""

    def call_body(token: cairn.SecretValue, n: int) -> str:
        try:
            service.call(token)
        except Unauthorized as exc:
            if refresh_on_error:
                raise cairn.CredentialExpired("the service refused the token") from exc
            raise
        return f"call {n} ok"

    call = app.tool(effect="read", name="call")(kind.fn(call_body))

    @kind.workflow(app, "daily")
    def daily(ctx: cairn.Context, token: cairn.Secret) -> Flow[list[str]]:
        first = yield call(token, 1)
        yield ctx.sleep(DAY)
        second = yield call(token, 2)
        return [first, second]

    return daily


def execute_on(app: cairn.App, run_id: str, worker: str) -> str:
    claim = app.store.claim_run(run_id, worker, 5.0, 5)
    assert claim is not None, f"run {run_id} is not claimable by {worker}"
    return execute(app.runtime, claim, worker).status


@both
@pytest.mark.parametrize("expiry", ["announced", "opaque"])
def test_a_token_that_expires_while_the_run_sleeps_a_day_is_refreshed(
    make_app: MakeApp, clock: FakeClock, kind: Kind, expiry: str
) -> None:
    """``announced``: the provider knows the token's expiry and refreshes it
    before use, so the service never sees an expired token. ``opaque``: it
    does not, the service refuses the cached token, the tool raises
    ``CredentialExpired`` and the runtime refreshes and sends again, within
    the same attempt (the tool has no retry policy)."""
    service = Service(clock, lifetime=3600.0, announce=expiry == "announced")
    app = make_app(cairn.Secrets(cairn.CallableSecrets(service.issue, clock=clock), clock=clock))
    daily = register(app, kind, service, refresh_on_error=True)
    app.start(daily, API, run_id="day")
    assert execute_on(app, "day", "w1") == "suspended"
    assert app.store.claim_run("day", "w1", 5.0, 5) is None  # asleep: not claimable for a day
    clock.advance(DAY + 1)  # the token expired 23 hours ago
    assert execute_on(app, "day", "w1") == "completed"
    assert app.get_run("day").status is cairn.RunStatus.COMPLETED
    tokens = service.tokens()
    assert len(tokens) == 2
    if expiry == "announced":
        assert service.seen == tokens
        assert service.rejected == 0
    else:
        assert service.seen == [tokens[0], tokens[0], tokens[1]]
        assert service.rejected == 1
    text = recorded_text(app, "day")
    assert [t for t in tokens if t in text] == []
    retried = [e for e in app.history("day") if e.event is cairn.EventType.STEP_RETRIED]
    assert retried == []  # a refresh is not a failed attempt


@both
def test_a_run_resumed_by_another_worker_after_a_day_gets_a_fresh_token(
    make_app: MakeApp, clock: FakeClock, kind: Kind
) -> None:
    """The first worker's token (and its provider cache) dies with it; the
    worker that takes the run after the day resolves the reference with its
    own provider and never sees the old token."""
    service = Service(clock, lifetime=3600.0, announce=False)

    def worker_app() -> cairn.App:
        app = make_app(cairn.Secrets(cairn.CallableSecrets(service.issue, clock=clock), clock=clock))
        register(app, kind, service, refresh_on_error=True)
        return app

    first = worker_app()
    first.start("daily", API, run_id="moved")
    assert execute_on(first, "moved", "w1") == "suspended"
    first.close()
    clock.advance(DAY)
    second = worker_app()
    assert execute_on(second, "moved", "w2") == "completed"
    assert service.rejected == 0
    assert service.seen == service.tokens()
    assert len(set(service.seen)) == 2
    assert second.get_run("moved").status is cairn.RunStatus.COMPLETED
