"""Signals, published events and approvals through the API, on SQLite and
PostgreSQL: each is the Operator acting as the token (the sender and the
decider recorded are the token's identity), an edit that does not fit the
request's schema is a 422 that stores nothing, the run continues with
exactly the edited value, and a request is decided once. Run ids with '/'
and other reserved characters work, percent-encoded, in every run route."""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import quote

import httpx

from cairn.server import ROUTES
from tests.timing import SLACK

from .conftest import OTHER, TENANT, LiveServer, Setup
from .test_authorization import SAMPLES
from .workflows import drain


def _actor(setup: Setup, who: str) -> str:
    return f"http:{who}-bot#{setup.tokens[who].split('_')[1]}"


def _path(run_id: str) -> str:
    return "/api/runs/" + quote(run_id, safe="")


def test_a_signal_wakes_the_run_once_per_key_and_records_the_sender(setup: Setup,
                                                                   client: httpx.Client) -> None:
    operator = setup.headers("operator")
    run_id = setup.app.start(setup.workflows["listener"], tenant=TENANT).run_id
    drain(setup.app)
    assert setup.app.get_run(run_id).status.value == "suspended"
    stage = client.get(f"{_path(run_id)}/published/stage", headers=setup.headers("viewer")).json()
    assert (stage["published"], stage["value"]) == (True, "waiting")

    refused = client.post(f"{_path(run_id)}/signals/go", json={"data": 1}, headers=setup.headers("viewer"))
    assert refused.status_code == 403
    keyed = {**operator, "Idempotency-Key": "send-1"}
    first = client.post(f"{_path(run_id)}/signals/go", json={"data": {"n": 7}}, headers=keyed)
    again = client.post(f"{_path(run_id)}/signals/go", json={"data": {"n": 7}}, headers=keyed)  # a retry
    assert (first.status_code, again.status_code) == (201, 200), first.text
    assert first.json()["delivery"]["seq"] == again.json()["delivery"]["seq"]
    assert first.json()["delivery"]["sender"] == _actor(setup, "operator")
    assert again.json()["created"] is False
    drain(setup.app)
    assert setup.app.handle(run_id).result(timeout=5) == {"n": 7}
    (delivered,) = setup.app.operator.mailbox(run_id)
    assert delivered.sender == _actor(setup, "operator")
    final = client.get(f"{_path(run_id)}/published/stage", headers=operator).json()
    assert final["value"] == {"got": {"n": 7}}

    finished = client.post(f"{_path(run_id)}/signals/go", json={}, headers=operator)
    assert finished.status_code == 409
    bad_name = client.post(f"{_path(run_id)}/signals/%01", json={}, headers=operator)
    assert bad_name.status_code == 400
    assert bad_name.json()["error"] == "invalid"


def test_a_published_event_read_waits_and_answers_not_yet(setup: Setup, client: httpx.Client) -> None:
    viewer = setup.headers("viewer")
    # no worker: it publishes nothing
    run_id = setup.app.start(setup.workflows["echo"], "x", tenant=TENANT).run_id
    waited = client.get(f"{_path(run_id)}/published/stage", params={"timeout": "0.2"}, headers=viewer)
    assert waited.status_code == 200
    assert waited.json() == {"run_id": run_id, "key": "stage", "published": False, "value": None, "seq": None,
                             "at": None}
    too_long = client.get(f"{_path(run_id)}/published/stage", params={"timeout": "31"}, headers=viewer)
    assert too_long.status_code == 400
    theirs = setup.app.start(setup.workflows["echo"], "y", tenant=OTHER).run_id
    assert client.get(f"{_path(theirs)}/published/stage", headers=viewer).status_code == 404


def test_approve_with_an_edit_validated_and_the_run_continues_with_it(setup: Setup,
                                                                     client: httpx.Client) -> None:
    operator = setup.headers("operator")
    run_id = setup.app.start(setup.workflows["payout"], "ada", 5, tenant=TENANT).run_id
    theirs = setup.app.start(setup.workflows["payout"], "eve", 9, tenant=OTHER).run_id
    drain(setup.app)
    hidden = client.get("/api/approvals", params={"run_id": theirs}, headers=setup.headers("viewer"))
    assert hidden.status_code == 404  # another tenant's run, as everywhere
    assert hidden.json()["error"] == "not_found"
    inbox = client.get("/api/approvals", headers=setup.headers("viewer")).json()["approvals"]
    assert [(a["run_id"], a["details"], a["pending"]) for a in inbox] == [(run_id, {"to": "ada", "amount": 5},
                                                                           True)]
    request_id = inbox[0]["request_id"]
    one = f"{_path(run_id)}/approvals/{request_id}"

    bad = client.post(f"{one}/approve", json={"edit": {"to": "bob", "amount": "lots"}}, headers=operator)
    assert bad.status_code == 422, bad.text
    assert bad.json()["error"] == "invalid_edit"
    assert "amount" in bad.json()["message"]
    assert client.get(one, headers=operator).json()["status"] == "pending"  # nothing stored
    assert client.post(f"{one}/approve", json={"edit": {"to": "bob"}}, headers=operator).status_code == 422

    viewer = client.post(f"{one}/approve", json={}, headers=setup.headers("viewer"))
    assert viewer.status_code == 403
    edited = client.post(f"{one}/approve", json={"edit": {"to": "bob", "amount": 3}, "comment": "less"},
                         headers=operator)
    assert edited.status_code == 200, edited.text
    decided = edited.json()
    assert (decided["status"], decided["edited"], decided["decided_by"], decided["comment"]) == (
        "edited", {"to": "bob", "amount": 3}, _actor(setup, "operator"), "less")
    twice = client.post(f"{one}/reject", json={}, headers=operator)
    assert twice.status_code == 409
    drain(setup.app)
    result = client.get(_path(run_id), headers=operator).json()
    assert result["status"] == "completed"
    assert result["result"] == {"decision": "edited", "paid": {"to": "bob", "amount": 3},
                                "by": _actor(setup, "operator")}
    assert client.get("/api/approvals", headers=operator).json()["approvals"] == []
    everything = client.get("/api/approvals", params={"pending": "false"}, headers=operator).json()
    assert [a["status"] for a in everything["approvals"]] == ["edited"]
    of_run = client.get(f"{_path(run_id)}/approvals", headers=operator).json()["approvals"]
    assert [a["request_id"] for a in of_run] == [request_id]


def test_reject_and_approvers(setup: Setup, client: httpx.Client) -> None:
    ada = setup.app.tokens.mint(TENANT, "operator", "ada").secret
    bob = setup.app.tokens.mint(TENANT, "operator", "bob").secret
    exact = [setup.app.tokens.check(ada).actor]  # a token approves by its whole identity, never by name
    guarded = setup.app.start(setup.workflows["payout"], "x", 1, exact, tenant=TENANT).run_id
    plain = setup.app.start(setup.workflows["payout"], "y", 2, tenant=TENANT).run_id
    drain(setup.app)
    requests = {a.run_id: a.request_id for a in setup.app.approvals()}

    def decide(run_id: str, verb: str, token: str) -> httpx.Response:
        return client.post(f"{_path(run_id)}/approvals/{requests[run_id]}/{verb}", json={"comment": "no"},
                           headers={"Authorization": f"Bearer {token}"})

    refused = decide(guarded, "approve", bob)
    assert refused.status_code == 403
    assert refused.json()["error"] == "not_an_approver"
    assert decide(guarded, "approve", ada).status_code == 200
    rejected = decide(plain, "reject", bob)
    assert rejected.status_code == 200
    assert rejected.json()["status"] == "rejected"
    drain(setup.app)
    assert setup.app.handle(plain).result(timeout=5)["decision"] == "rejected"
    assert setup.app.handle(guarded).result(timeout=5)["by"].startswith("http:ada#")
    unknown = client.get(f"{_path(plain)}/approvals/nope", headers=setup.headers("viewer"))
    assert unknown.status_code == 404


RESERVED = "team/a b?c#d%2F&e+f;g=h/events"


def test_run_ids_with_reserved_characters_work_in_every_run_route(setup: Setup, client: httpx.Client) -> None:
    admin = setup.headers("admin")
    # started through the library: an id chosen over HTTP lands in the tenant's
    # namespace ('tenant:acme:...'), and the routes must take any id as it is
    setup.app.start("listener", run_id=RESERVED, tenant=TENANT)
    setup.app.start("echo", "decoy", run_id="team", tenant=TENANT)
    drain(setup.app)
    shown = client.get(_path(RESERVED), headers=admin).json()
    assert shown["run_id"] == RESERVED
    assert shown["workflow"] == "listener"
    routes = [spec for spec in ROUTES if "{run_id}" in spec.path and "{request_id}" not in spec.path]
    assert len(routes) > 10
    for spec in routes:
        body, params = SAMPLES[(spec.method, spec.path)]
        path = spec.path.replace("{run_id}", quote(RESERVED, safe="")).format(**params)
        if spec.stream is not None:
            with client.stream("GET", path, headers=admin) as response:
                assert response.status_code == 200, path
                first = next(line for line in response.iter_lines() if line.startswith("data:"))
                assert '"seq":1' in first
            continue
        response = client.request(spec.method, path, headers=admin, json=body)
        where = f"{spec.method} {path}: {response.status_code} {response.text}"
        assert response.status_code not in (404, 405), where
        assert response.status_code < 500, where
        answer: Any = response.json()
        if isinstance(answer, dict) and "run_id" in answer:
            assert answer["run_id"] == RESERVED
    assert client.get(_path("team"), headers=admin).json()["input"] == {"text": "decoy"}


class InFlight:
    """ASGI middleware counting the requests being answered."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.count = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        self.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.count -= 1


def test_waiting_readers_hold_no_thread_of_the_server(setup: Setup) -> None:
    """More long polls than the server has threads (Starlette's pool: 40)
    wait on a run that has not started; another request is still answered
    while every one of them waits, and all of them get the value once the
    run publishes it."""
    run_id = setup.app.start(setup.workflows["listener"], tenant=TENANT).run_id  # no worker yet
    seen: dict[str, InFlight] = {}

    def wrap(asgi: Any) -> Any:
        seen["m"] = InFlight(asgi)
        return seen["m"]

    with LiveServer(setup.app, wrap=wrap) as server:
        _long_polls(setup, server, seen["m"], run_id)


def _long_polls(setup: Setup, server: LiveServer, inflight: InFlight, run_id: str) -> None:
    viewer = setup.headers("viewer")
    answers: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def wait() -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                answers.append(http.get(f"{_path(run_id)}/published/stage", params={"timeout": "30"},
                                        headers=viewer).json())
        except BaseException as exc:
            failures.append(exc)

    waiters = [threading.Thread(target=wait) for _ in range(60)]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 30 * SLACK
    while inflight.count < len(waiters):  # every reader is inside the server, waiting
        assert time.monotonic() < deadline, f"only {inflight.count} readers arrived"
        time.sleep(0.01)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        shown = http.get(_path(run_id), headers=viewer)
    assert shown.status_code == 200
    assert answers == [], "a reader returned before the run published anything"
    drain(setup.app)
    for t in waiters:
        t.join(60)
    assert not failures, failures[:1]
    assert len(answers) == 60
    assert {a["published"] for a in answers} == {True}
