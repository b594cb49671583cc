"""``/api/runs/{id}/signals/{name}`` and ``/api/runs/{id}/published/{key}``:
talking to a running workflow from outside.

A signal goes into the run's mailbox through the ``Operator`` acting as the
token (its identity is the message's recorded sender); ``Idempotency-Key``
is the mailbox's ``dedupe``, so a client that retries a send it never saw
answered delivers it once. A published event (``ctx.set_event``) is read
through the same façade; ``?timeout=`` waits for a first value (long
polling) and answers ``"published": false`` when none came, which is an
answer, not an error: the run exists and has simply said nothing yet.

The published-event path is ``/published/{key}``, not ``/events/{key}``:
``/events`` is the run's SSE stream, and two resources under one word would
read as one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from cairn.api.ledger import decode
from cairn.api.operator import Published
from cairn.api.tokens import Role
from cairn.engine.messaging import signal_key
from cairn.server.errors import ApiError
from cairn.server.routing import Call, Endpoint
from cairn.store.records import Delivery, RunRecord

#: the longest a published-event read waits (a client wanting longer asks again)
MAX_WAIT = 30.0
_KEY = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


class SignalBody(msgspec.Struct, forbid_unknown_fields=True):
    """The signal's data: any JSON value (the receiving ``wait_for_signal``
    checks it against the type it expects). Left out: ``null``."""

    data: Any = None


class WaitQuery(msgspec.Struct):
    """``timeout``: seconds to wait for a first value (0: answer now)."""

    timeout: Annotated[float, msgspec.Meta(ge=0, le=MAX_WAIT)] = 0.0


class DeliveryOut(msgspec.Struct):
    """A message in the run's mailbox."""

    run_id: str
    seq: int
    key: str
    sender: str | None
    dedupe: str | None
    sent_at: float
    taken_at: float | None


class SentOut(msgspec.Struct):
    """``created``: this call delivered it (false: an earlier one with the same key did)."""

    created: bool
    delivery: DeliveryOut


class PublishedOut(msgspec.Struct):
    """``published``: whether the run published a value under ``key`` (by the end of the wait)."""

    run_id: str
    key: str
    published: bool
    value: Any
    seq: int | None
    at: float | None


def delivery_json(delivery: Delivery) -> dict[str, Any]:
    return {"run_id": delivery.run_id, "seq": delivery.seq, "key": delivery.key, "sender": delivery.sender,
            "dedupe": delivery.dedupe, "sent_at": delivery.sent_at, "taken_at": delivery.taken_at}


def _dedupe(call: Call[Any]) -> str | None:
    key = call.request.headers.get("idempotency-key")
    if key is None:
        return None
    try:
        return msgspec.convert(key, _KEY)
    except msgspec.ValidationError:
        raise ApiError(422, "invalid", "the Idempotency-Key header must be 1 to 200 printable characters") \
            from None


def _same_signal(call: Call[Any], delivery: Delivery, data: Any) -> None:
    """A send that found its key delivered already must be the request that
    delivered it (the same signal and data), not another one dropped unsaid."""
    stored = decode(call.operator.codec, delivery.payload, "the signal's data")
    if delivery.key != signal_key(call.path["name"]) or (stored.error is None and stored.value != data):
        raise ApiError(422, "idempotency_key_reused", f"Idempotency-Key {delivery.dedupe!r} was used for "
                                                      "another signal or data to this run: choose a new key")


def send_signal(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    body: SignalBody = call.body
    sent = call.operator.signal(record.run_id, call.path["name"], body.data, dedupe=_dedupe(call))
    if not sent.created:
        _same_signal(call, sent.delivery, body.data)
    return JSONResponse({"created": sent.created, "delivery": delivery_json(sent.delivery)},
                        status_code=201 if sent.created else 200)


def _look(call: Call[Any], run_id: str, key: str) -> tuple[RunRecord, Published | None]:
    # the run first: if it has finished, the read after it sees everything it published
    run = call.run(run_id)
    return run, call.operator.latest_event(run_id, key)


async def read_published(call: Call[Any]) -> Any:
    """``Operator.get_event``'s wait (the same backoff, 5 ms doubling to
    250 ms), written on the event loop: a thread is taken only for each look,
    so clients waiting here cannot hold the server's threads."""
    run_id, key = call.path["run_id"], call.path["key"]
    query: WaitQuery = call.query
    deadline = time.monotonic() + query.timeout
    delay = 0.005
    while True:
        record, found = await run_in_threadpool(_look, call, run_id, key)
        remaining = deadline - time.monotonic()
        if found is not None or remaining <= 0 or record.status.terminal:
            break
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.25)
    if found is None:
        return {"run_id": record.run_id, "key": key, "published": False, "value": None, "seq": None,
                "at": None}
    return {"run_id": record.run_id, "key": key, "published": True, "value": found.value, "seq": found.seq,
            "at": found.at}


ROUTES = [
    Endpoint("POST", "/api/runs/{run_id}/signals/{name}", Role.OPERATOR,
             "Send a signal to the run (idempotent on the Idempotency-Key header)", send_signal,
             body=SignalBody, status=201, tag="signals", idempotent=True, response=SentOut,
             returns="The delivery (201: delivered now; 200: an earlier send with the same key did)"),
    Endpoint("GET", "/api/runs/{run_id}/published/{key}", Role.VIEWER,
             "The latest value the run published under key (ctx.set_event), waiting up to ?timeout= s",
             read_published, query=WaitQuery, tag="signals", response=PublishedOut),
]
