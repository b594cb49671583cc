"""The app of the canary test: a run that carries secrets through every
place Cairn records something, executed by real ``cairn worker`` processes.

``build_app`` makes it for the test process; ``cairn worker --app
tests.security.canary_app:app`` builds ``app`` from the environment (a
module ``__getattr__``, so importing the module in the test process opens
no database). The outside world lives in files of the control directory:

* ``valid-token``: the only API token the "service" accepts right now (the
  test rotates it, and the secret's file, while runs wait);
* ``holding`` / ``go``: ``hold`` announces it holds a resolved token and
  waits for ``go`` (the test SIGKILLs the worker meanwhile);
* ``paused`` / ``go-pay``: ``pause`` waits between ``hold`` and ``pay``;
* ``paid.jsonl``: one line per transfer the service accepted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import cairn
from cairn.models import Message
from cairn.models.openai import OpenAIChat

SECRETS_ENV = "CAIRN_TEST_SECRETS_DIR"
CONTROL_ENV = "CAIRN_TEST_CONTROL"
OPENAI_ENV = "CAIRN_TEST_OPENAI_URL"

TOKEN = cairn.Secret("api-token", provider="vault")
MODEL_KEY = cairn.Secret("openai-key", provider="files")


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} never appeared")
        time.sleep(0.01)


def build_app(db: str | None, secrets_dir: Path, control: Path, openai_url: str) -> cairn.App:
    files = cairn.FileSecrets(secrets_dir)
    # a vault client with a cache: the token it handed out stays in use until refreshed
    vault = cairn.CallableSecrets(lambda ref, access: files.get(ref, access),
                                  lambda ref, access: files.refresh(ref, access))
    app = cairn.App(db, secrets={"vault": vault, "files": files}, inline_limit=2048, lease_seconds=1.0)
    chat = OpenAIChat("fake-model", base_url=openai_url, api_key=MODEL_KEY, timeout=10.0)

    def service_accepts(token: cairn.SecretValue) -> bool:
        return token.reveal() == (control / "valid-token").read_text()

    @app.tool(effect="read", retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0.05, jitter=0))
    def lookup(token: cairn.SecretValue, ticket: str) -> dict[str, Any]:
        info = cairn.step_info()
        if info.attempt == 1:  # a client library that quotes the header it sent
            raise ConnectionError(f"HTTP 503 from api.example: request had Authorization: Bearer "
                                  f"{token.reveal()}")
        if not service_accepts(token):
            raise cairn.CredentialExpired("HTTP 401")
        # large enough to be stored as an artifact, with the reference inside it
        return {"ticket": ticket, "page": "charged twice. " * 200, "auth": TOKEN}

    @app.step()
    def hold(token: cairn.SecretValue) -> str:
        assert token.reveal()
        (control / "holding").write_text(str(os.getpid()))
        _wait_for(control / "go")
        return "held"

    @app.step()
    def pause() -> str:
        (control / "paused").write_text(str(os.getpid()))
        _wait_for(control / "go-pay")
        return "resumed"

    def find_payment(op: cairn.Operation) -> cairn.Done[dict[str, Any]] | cairn.NotFound:
        paid = control / "paid.jsonl"
        for line in (paid.read_text().splitlines() if paid.exists() else []):
            record = json.loads(line)
            if record["key"] == op.operation_id:
                return cairn.Done({"key": record["key"], "cents": record["cents"]})
        return cairn.NotFound()

    @app.tool(effect="write", reconcile=find_payment)
    def pay(op: cairn.Operation, token: cairn.SecretValue, cents: int) -> dict[str, Any]:
        if not service_accepts(token):
            # refused by the service's auth: the transfer certainly did not happen
            raise cairn.CredentialExpired(f"HTTP 401: token {token.reveal()} is no longer valid")
        with (control / "paid.jsonl").open("a") as paid:
            paid.write(json.dumps({"key": op.operation_id, "cents": cents}) + "\n")
        return {"key": op.operation_id, "cents": cents}

    @app.workflow(name="canary")
    def canary(ctx: cairn.Context, token: cairn.Secret, ticket: str) -> dict[str, Any]:
        page = lookup(token, ticket)
        answer = ctx.model(chat, [Message(role="user", content=f"{page['ticket']}: refund?")])
        ctx.sleep(0.2)
        hold(token)
        pause()
        receipt = pay(token, cents=1250)
        return {"answer": answer.message.text, "receipt": receipt, "token": token}

    @app.tool(effect="read", name="fetch")
    def fetch(token: cairn.SecretValue) -> str:
        raise PermissionError(f"403 Forbidden for token={token.reveal()}")

    @app.workflow(name="canary-fail")
    def canary_fail(ctx: cairn.Context, token: cairn.Secret) -> str:
        return fetch(token)  # fails the run: its error is recorded and logged

    return app


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(name)
    environ = os.environ
    app = build_app(None, Path(environ[SECRETS_ENV]), Path(environ[CONTROL_ENV]), environ[OPENAI_ENV])
    globals()["app"] = app
    return app
