"""Secrets in runs: resolved at the moment of use, refreshed when they
expire, never recorded. On SQLite and PostgreSQL (``app``), sync and async
(``kind``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import cairn
from cairn.engine.credentials import MAX_REFRESHES
from cairn.models import Message
from cairn.security.secrets import Access, as_ref
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import Calls
from tests.engine.kinds import Flow, Kind, both
from tests.security.world import Service, Unauthorized, recorded_text

API = cairn.Secret("api", scope="payments")


def reconcile_nothing(op: cairn.Operation) -> cairn.NotFound:
    return cairn.NotFound()


@both
def test_a_secret_parameter_gets_the_value_and_the_journal_only_the_reference(
    app: cairn.App, kind: Kind
) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)
    received: list[Any] = []
    operations: list[cairn.Operation] = []

    def fetch_body(url: str, token: cairn.SecretValue) -> str:
        received.append(token)
        service.call(token)
        return f"page {url}"

    def pay_body(op: cairn.Operation, token: cairn.SecretValue, cents: int) -> dict[str, Any]:
        received.append(token)
        operations.append(op)
        service.call(token)
        return {"paid": cents, "key": op.operation_id}

    fetch = app.step(name="fetch")(kind.fn(fetch_body))
    pay = app.tool(effect="write", reconcile=reconcile_nothing)(kind.fn(pay_body))

    @kind.workflow(app, "agent")
    def agent(ctx: cairn.Context, token: cairn.Secret) -> Flow[dict[str, Any]]:
        assert isinstance(token, cairn.Secret)  # the workflow itself holds the reference
        page = yield fetch("https://x", token)
        receipt = yield pay(token, cents=1250)
        return {"page": page, "receipt": receipt, "token": token}

    result = app.run(agent, API, run_id="a")
    assert as_ref(result["token"]) == API  # a reference comes back as (the JSON of) a reference
    assert [type(v) for v in received] == [cairn.SecretValue, cairn.SecretValue]
    assert [v.ref for v in received] == [API, API]
    assert service.rejected == 0
    assert len(service.tokens()) == 1  # cached by the provider: one token for both calls
    text = recorded_text(app, "a")
    assert [token for token in service.tokens() if token in text] == []
    assert '"$cairn":"secret"' in text  # the reference is what is recorded
    # what a reconciler and an operator see is the reference too
    [view] = app.operator.operations("a").operations
    assert view.arguments is not None
    reference = {"$cairn": "secret", "name": "api", "scope": "payments"}
    assert view.arguments.value == {"token": reference, "cents": 1250}
    assert operations[0].arguments["token"] == {"$cairn": "secret", "name": "api", "scope": "payments"}


@both
def test_each_attempt_resolves_the_secret_again(app: cairn.App, kind: Kind) -> None:
    """A retried attempt (after a durable backoff) uses the value current
    then, not the one the failed attempt had: the provider is asked again."""
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue, cache=False)
    seen: list[str] = []

    def flaky_body(token: cairn.SecretValue) -> int:
        seen.append(token.reveal())
        if len(seen) == 1:
            raise ConnectionError("reset by peer")
        return len(seen)

    flaky = app.step(name="flaky", retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))(
        kind.fn(flaky_body))

    @kind.workflow(app, "retrying")
    def retrying(ctx: cairn.Context) -> Flow[int]:
        return (yield flaky(API))

    assert app.run(retrying, run_id="r") == 2
    assert len(set(seen)) == 2
    assert seen == service.tokens()


@both
def test_an_expired_credential_is_refreshed_and_retried_without_spending_an_attempt(
    app: cairn.App, kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)
    seen: list[str] = []

    def call_body(token: cairn.SecretValue) -> str:
        seen.append(token.reveal())
        try:
            service.call(token)
        except Unauthorized as exc:
            raise cairn.CredentialExpired(str(exc)) from exc
        return "ok"

    call = app.tool(effect="read")(kind.fn(call_body))  # no retry policy: one attempt

    @kind.workflow(app, "expiring")
    def expiring(ctx: cairn.Context) -> Flow[str]:
        return (yield call(API))

    app.run(expiring, run_id="warm")  # the provider now caches a token
    service.revoke_all()  # it expires behind the provider's back
    with caplog.at_level(logging.INFO, logger="cairn"):
        assert app.run(expiring, run_id="e") == "ok"
    assert len(seen) == 3
    assert seen[1] == seen[0]
    assert seen[2] != seen[1]
    history = app.history("e")
    assert [e.event for e in history if e.event in (EventType.STEP_RETRIED, EventType.STEP_FAILED)] == []
    [done] = [e for e in history if e.event is EventType.STEP_COMPLETED]
    assert done.attempt == 1
    assert "refreshed secret 'api'" in caplog.text
    assert not [t for t in service.tokens() if t in caplog.text or t in recorded_text(app, "e")]


@both
def test_a_step_is_refreshed_and_run_again_the_same_way(app: cairn.App, kind: Kind) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)
    seen: list[str] = []

    def sync_body(token: cairn.SecretValue) -> int:
        seen.append(token.reveal())
        if len(seen) == 1:
            service.revoke_all()
            raise cairn.CredentialExpired("the token was revoked", secret="api")
        service.call(token)
        return len(seen)

    sync = app.step(name="sync")(kind.fn(sync_body))

    @kind.workflow(app, "stepping")
    def wf(ctx: cairn.Context) -> Flow[int]:
        return (yield sync(API))

    assert app.run(wf, run_id="st") == 2
    assert seen == service.tokens()
    assert len(set(seen)) == 2
    [done] = [e for e in app.history("st") if e.event is EventType.STEP_COMPLETED]
    assert done.attempt == 1


@both
def test_a_write_tool_is_sent_again_after_credential_expired_with_the_same_operation_id(
    app: cairn.App, kind: Kind
) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)
    attempts: list[tuple[str, int, str]] = []

    def transfer_body(op: cairn.Operation, token: cairn.SecretValue, cents: int) -> str:
        attempts.append((op.operation_id, op.attempt, token.reveal()))
        if len(attempts) == 1:
            raise cairn.CredentialExpired("401: token expired", secret="api")  # refused: nothing moved
        service.call(token)
        return op.operation_id

    transfer = app.tool(effect="write")(kind.fn(transfer_body))  # no reconcile, no retry policy

    @kind.workflow(app, "transfer")
    def wf(ctx: cairn.Context) -> Flow[str]:
        return (yield transfer(API, 500))

    key = app.run(wf, run_id="t")
    assert [(a[0], a[1]) for a in attempts] == [(key, 1), (key, 1)]  # same effect, same key, same attempt
    assert attempts[0][2] != attempts[1][2]
    history = app.history("t")
    assert len([e for e in history if e.event is EventType.OP_INTENT]) == 1
    assert app.get_run("t").status is RunStatus.COMPLETED


@both
def test_a_write_tool_is_never_resent_on_a_merely_classified_error(app: cairn.App, kind: Kind) -> None:
    """A provider's classifier sees an exception type, not whether the
    service applied the request: for a read tool it triggers a refresh, for
    a write tool the effect stays uncertain (here: an operator is asked)."""
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue, is_expired=lambda exc: isinstance(exc, Unauthorized))
    bodies: list[str] = []

    def read_body(token: cairn.SecretValue) -> str:
        bodies.append("read")
        service.call(token)
        return "read ok"

    def write_body(token: cairn.SecretValue) -> str:
        bodies.append("write")
        service.call(token)
        return "written"

    read = app.tool(effect="read", name="read")(kind.fn(read_body))
    write = app.tool(effect="write", name="write")(kind.fn(write_body))

    @kind.workflow(app, "classified")
    def wf(ctx: cairn.Context) -> Flow[str]:
        first = yield read(API)
        service.revoke_all()
        second = yield write(API)
        return f"{first} {second}"

    with pytest.raises(cairn.RunNeedsAttention, match="Unauthorized"):
        app.run(wf, run_id="c")
    assert bodies == ["read", "write"]
    service.revoke_all()
    bodies.clear()

    @kind.workflow(app, "classified-read")
    def wf2(ctx: cairn.Context) -> Flow[str]:
        return (yield read(API))

    assert app.run(wf2, run_id="c2") == "read ok"
    assert bodies == ["read", "read"]  # refused once, refreshed, accepted


@both
def test_refreshes_are_bounded_and_then_the_retry_policy_decides(app: cairn.App, kind: Kind) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)
    bodies: list[int] = []

    def stubborn_body(op: cairn.Operation, token: cairn.SecretValue) -> str:
        bodies.append(op.attempt)
        raise cairn.CredentialExpired("401: this service refuses every token")

    stubborn = app.tool(effect="write", retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))(
        kind.fn(stubborn_body))

    @kind.workflow(app, "stubborn")
    def wf(ctx: cairn.Context) -> Flow[str]:
        try:
            yield stubborn(API)
        except cairn.StepFailed as failed:
            return failed.error_type
        return "succeeded?"

    assert app.run(wf, run_id="s") == "CredentialExpired"  # a definite failure: never needs_attention
    per_attempt = 1 + MAX_REFRESHES
    assert bodies == [1] * per_attempt + [2] * per_attempt
    assert len(service.tokens()) == 1 + 2 * MAX_REFRESHES


@both
def test_a_failed_refresh_is_a_definite_failure_of_the_attempt(app: cairn.App, kind: Kind) -> None:
    def refresh(ref: cairn.Secret, access: Access) -> str:
        raise PermissionError("refresh token revoked")

    app.secrets = cairn.CallableSecrets(lambda ref, access: "first-token-value", refresh)
    bodies: list[str] = []

    def pay_body(token: cairn.SecretValue) -> str:
        bodies.append(token.reveal())
        raise cairn.CredentialExpired("401")

    pay = app.tool(effect="write")(kind.fn(pay_body))

    @kind.workflow(app, "norefresh")
    def wf(ctx: cairn.Context) -> Flow[str]:
        try:
            yield pay(API)
        except cairn.StepFailed as failed:
            return failed.message
        return "?"

    message = app.run(wf, run_id="n")
    assert "refreshing secret 'api' failed" in message
    assert "refresh token revoked" in message
    assert bodies == ["first-token-value"]


@both
def test_a_secret_that_cannot_be_resolved_fails_the_call_before_its_body_runs(
    app: cairn.App, kind: Kind, calls: Calls
) -> None:
    app.secrets = cairn.EnvSecrets(environ={})

    def pay_body(token: cairn.SecretValue) -> str:
        calls.hit("pay")
        return "paid"

    pay = app.tool(effect="write")(kind.fn(pay_body))

    @kind.workflow(app, "missing")
    def wf(ctx: cairn.Context) -> Flow[str]:
        try:
            yield pay(cairn.Secret("nope"))
        except cairn.StepFailed as failed:
            return f"{failed.error_type}: {failed.message}"
        return "?"

    assert app.run(wf, run_id="m") == (
        "SecretNotFound: secret 'nope': the environment variable CAIRN_SECRET_NOPE is not set")
    assert calls["pay"] == 0  # definite: not needs_attention, although a write


@both
def test_values_where_references_belong_are_refused_before_anything_is_recorded(
    app: cairn.App, kind: Kind, calls: Calls
) -> None:
    app.secrets = cairn.CallableSecrets(lambda ref, access: "resolved-token-value")
    resolved = app.secrets.resolve(API)

    def use_body(token: cairn.SecretValue) -> str:
        calls.hit("use")
        return "used"

    def plain_body(data: Any) -> str:
        calls.hit("plain")
        return "plain"

    use = app.step(name="use")(kind.fn(use_body))
    plain = app.tool(effect="write", name="plain")(kind.fn(plain_body))

    @kind.workflow(app, "refusals")
    def wf(ctx: cairn.Context) -> Flow[list[str]]:
        errors = []
        for call in (lambda: use("resolved-token-value"), lambda: use(resolved),
                     lambda: plain({"headers": [resolved]})):
            try:
                yield call()
            except cairn.PayloadError as exc:
                errors.append(str(exc))
        return errors

    errors = app.run(wf, run_id="v")
    assert "parameter 'token' takes a cairn.Secret reference, not a str" in errors[0]
    assert "not a resolved SecretValue" in errors[1]
    assert isinstance(errors, list)
    assert "SecretValue 'api'" in errors[2]
    assert "tool 'plain'" in errors[2]
    assert calls.counts == {}
    history = app.history("v")
    assert [e for e in history if e.step_kind in ("step", "tool")] == []
    assert "resolved-token-value" not in recorded_text(app, "v")

    @app.workflow(name="takes")
    def takes(ctx: cairn.Context, token: cairn.Secret) -> None:
        return None

    with pytest.raises(cairn.SecretLeak, match=r"value\['token'\].*SecretValue 'api'"):
        app.start(takes, resolved, run_id="v2")
    assert app.list_runs(workflow="takes") == []


@both
def test_a_body_that_returns_or_forwards_the_value_is_refused(app: cairn.App, kind: Kind) -> None:
    app.secrets = cairn.CallableSecrets(lambda ref, access: "the-real-token-1234")
    model = kind.scripted(lambda request, n: Message(role="assistant", content="ok"))

    def leak_body(token: cairn.SecretValue) -> Any:
        return token

    def echo_body(token: cairn.SecretValue) -> str:
        return f"Bearer {token.reveal()}"

    leak = app.step(name="leak")(kind.fn(leak_body))
    echo = app.step(name="echo")(kind.fn(echo_body))
    revealed: list[str] = []

    def reveal_body(token: cairn.SecretValue) -> int:
        revealed.append(token.reveal())
        return 0

    reveal = app.step(name="reveal")(kind.fn(reveal_body))

    @kind.workflow(app, "leaks")
    def wf(ctx: cairn.Context) -> Flow[list[str]]:
        out = []
        for call in (lambda: leak(API), lambda: echo(API)):
            try:
                yield call()
            except cairn.StepFailed as failed:
                out.append(f"{failed.error_type}: {failed.message}")
        yield reveal(API)
        try:  # the body handed the value to the workflow, which puts it into a prompt
            yield kind.model(ctx, model, [Message(role="user", content=f"use {revealed[0]}")])
        except cairn.SecretLeak as exc:
            out.append(str(exc))
        return out

    out = app.run(wf, run_id="l")
    assert out[0].startswith("SecretLeak: the result of step 'leak'")
    assert "SecretValue 'api'" in out[0]
    assert out[1].startswith("SecretLeak: the result of step 'echo'")
    assert "secret 'api'" in out[1]
    assert "request to model 'scripted-1' holds the revealed value of secret 'api'" in out[2]
    assert model.calls == 0  # refused before it was sent
    assert "the-real-token-1234" not in recorded_text(app, "l")


@both
def test_error_messages_and_log_lines_never_show_a_revealed_value(
    app: cairn.App, kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)

    def fetch_body(token: cairn.SecretValue) -> str:
        service.revoke_all()
        service.call(token)  # Unauthorized, quoting the token
        return "?"

    fetch = app.tool(effect="read", name="fetch")(kind.fn(fetch_body))

    @kind.workflow(app, "failing")
    def wf(ctx: cairn.Context) -> Flow[str]:
        return (yield fetch(API))

    with caplog.at_level(logging.DEBUG), \
            pytest.raises(cairn.RunFailed, match=r"Authorization: Bearer \*\*\*") as failed:
        app.run(wf, run_id="f")
    run = app.get_run("f")
    assert run.error is not None
    assert "Bearer ***" in run.error["message"]
    [token] = service.tokens()
    assert token not in str(failed.value)
    assert token not in recorded_text(app, "f")
    assert token not in caplog.text


@both
def test_a_child_gets_the_reference_and_resolves_it_as_its_own_run(app: cairn.App, kind: Kind) -> None:
    seen: list[tuple[str, str]] = []
    app.secrets = cairn.CallableSecrets(lambda ref, access: f"token-of-{access.tenant}-{ref.name}")

    def use_body(token: cairn.SecretValue) -> str:
        info = cairn.step_info()
        seen.append((info.run_id, token.reveal()))
        return "used"

    use = app.tool(effect="read", name="use")(kind.fn(use_body))

    @kind.workflow(app, "child")
    def child(ctx: cairn.Context, token: cairn.Secret) -> Flow[str]:
        return (yield use(token))

    @kind.workflow(app, "parent")
    def parent(ctx: cairn.Context, token: cairn.Secret) -> Flow[str]:
        return (yield ctx.child(child, token))

    assert app.run(parent, API, run_id="p", tenant="acme") == "used"
    assert seen == [("p:0", "token-of-acme-api")]
    assert "token-of-acme-api" not in recorded_text(app, "p") + recorded_text(app, "p:0")


@both
def test_a_cached_value_is_looked_for_in_every_run_that_uses_it(app: cairn.App, kind: Kind) -> None:
    """The provider hands the same cached value to a later run (another
    execution): that run's records are searched for it too."""
    app.secrets = cairn.CallableSecrets(lambda ref, access: "cached-token-5678")

    def echo_body(token: cairn.SecretValue, loud: bool) -> str:
        return f"Bearer {token.reveal()}" if loud else "quiet"

    echo = app.step(name="echo")(kind.fn(echo_body))

    @kind.workflow(app, "echoing")
    def wf(ctx: cairn.Context, loud: bool) -> Flow[str]:
        try:
            return (yield echo(API, loud))
        except cairn.StepFailed as failed:
            return failed.error_type

    assert app.run(wf, False, run_id="first") == "quiet"
    assert app.run(wf, True, run_id="second") == "SecretLeak"
    assert "cached-token-5678" not in recorded_text(app, "second")
