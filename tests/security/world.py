"""The outside world of the secrets tests: a service that accepts only the
tokens it issued and that have not expired by its clock, and a way to read
everything a run recorded."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import cairn
from cairn.security.secrets import Access


class Unauthorized(Exception):
    """What the service's client library raises for a refused token. Like
    many, it quotes the credential it sent in its message."""


class Service:
    """Issues tokens valid ``lifetime`` seconds by ``clock`` (for ever with
    ``None``) and checks them on every call; ``announce`` says whether the
    issued token carries its expiry (an OAuth ``expires_in``) or is opaque."""

    def __init__(self, clock: Callable[[], float] = time.time, lifetime: float | None = 3600.0,
                 *, announce: bool = True) -> None:
        self.clock = clock
        self.lifetime = lifetime
        self.announce = announce
        self.expiry: dict[str, float | None] = {}
        #: every token presented to the service, in order
        self.seen: list[str] = []
        self.rejected = 0
        self._lock = threading.Lock()

    def issue(self, ref: cairn.Secret, access: Access) -> tuple[str, float | None]:
        with self._lock:
            token = f"tok-{len(self.expiry) + 1}-{secrets.token_hex(12)}"
            expires = None if self.lifetime is None else self.clock() + self.lifetime
            self.expiry[token] = expires
        return token, expires if self.announce else None

    def revoke_all(self) -> None:
        with self._lock:
            for token in self.expiry:
                self.expiry[token] = float("-inf")

    def call(self, token: cairn.SecretValue) -> None:
        text = token.reveal()
        with self._lock:
            self.seen.append(text)
            expires = self.expiry.get(text, float("-inf"))
            if text not in self.expiry or (expires is not None and self.clock() >= expires):
                self.rejected += 1
                raise Unauthorized(f"401 Unauthorized: invalid or expired token "
                                   f"(Authorization: Bearer {text})")

    def tokens(self) -> list[str]:
        return list(self.expiry)


def recorded_text(app: cairn.App, run_id: str) -> str:
    """Everything the store holds for ``run_id``, as text: every history
    entry (payloads decoded from their bytes, artifacts fetched), and the
    run's input, result and error."""
    parts: list[str] = []
    codec = app.runtime.payloads
    for event in app.history(run_id):
        parts.append(repr(event))
        if event.payload is not None:
            parts.append(codec.raw(event.payload, what="entry").decode())
    run = app.get_run(run_id)
    parts.append(repr(run))
    for payload in (run.input, run.result):
        if payload is not None:
            parts.append(codec.raw(payload, what="run").decode())
    return "\n".join(parts)


def count_in(text: str, values: list[str]) -> dict[str, int]:
    return {value: text.count(value) for value in values if value in text}


def body_kinds(received: list[Any]) -> set[str]:
    return {type(value).__name__ for value in received}
