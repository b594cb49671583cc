"""Signals and published events: how a run talks with the world while it runs.

A **signal** is a message delivered into a run's mailbox (``Store.deliver``)
under the wait key ``signal:NAME``. ``receive`` (``ctx.wait_for_signal``)
takes the oldest message of that name the run has not consumed yet; if there
is none it suspends the run (``Suspend(waiting_for=...)``: no worker slot,
thread or process is held) until a delivery makes it runnable, or until its
durable timeout. Journaling:

* with a timeout, the deadline is recorded first, at its own position (like
  ``ctx.sleep``'s wake time), so every replay and every worker sees the very
  same deadline, and a timeout fires after any number of restarts;
* the receive itself is one position whose entry is written in the same
  transaction that marks the message consumed (``Execution.take_delivery``),
  so a message is consumed exactly once and replay returns what the first
  execution read. A timeout, or a message whose data does not fit ``type_``
  (consumed, so it cannot block the messages behind it), is recorded there as
  a failure that replay raises again (``SignalTimeout``, ``InvalidSignal``).

``send`` (``ctx.signal``) delivers from one run to another exactly once: the
delivery carries the sending call's operation id as its ``dedupe`` key, so a
send re-executed after a crash between the delivery and its journal entry
finds the message it delivered before and delivers nothing new.

A **published event** (``ctx.set_event``) is a journal entry of kind
``event`` named by its key: readers (``app.get_event``) take the latest one
through a partial index (``Store.latest_event``), so publishing costs one
append, like a step, and no second table is kept in step with the journal.
"""

from __future__ import annotations

import time
from typing import Any

from cairn.codec import values
from cairn.engine.execution import INFRASTRUCTURE_ERRORS, Call, Execution, error_detail, operation_id
from cairn.engine.signals import Abandon, Suspend
from cairn.engine.steps import input_hash
from cairn.errors import (
    InvalidArgument,
    InvalidRunState,
    InvalidSignal,
    PayloadError,
    RunNotFound,
    SignalRefused,
    SignalTimeout,
)
from cairn.faults import fault_point
from cairn.store.records import Delivery, EventType

#: The prefix of a signal's wait key in the mailbox.
SIGNAL_PREFIX = "signal:"
#: The longest signal name or event key.
MAX_NAME = 200


def check_name(what: str, name: Any) -> str:
    """A signal name or event key: a non-empty line of text (it appears in
    the journal, in ``cairn show`` and on the command line)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} must be a non-empty string, not {name!r}")
    if len(name) > MAX_NAME:
        raise InvalidArgument(f"{what} is longer than {MAX_NAME} characters")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        raise InvalidArgument(f"{what} {name!r} contains control characters")
    return name


def signal_key(name: str) -> str:
    """The mailbox wait key of signal ``name``."""
    return SIGNAL_PREFIX + check_name("a signal name", name)


# -- receiving --------------------------------------------------------------------------


def receive(ex: Execution, name: str, timeout: float | None, type_: Any) -> Any:
    """``ctx.wait_for_signal``: the next signal ``name``'s data as ``type_``."""
    key = signal_key(name)
    if timeout is not None and not timeout >= 0:
        raise InvalidArgument(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    deadline: float | None = None
    if timeout is not None:
        # The deadline comes first, at a position of its own, so it is fixed
        # before the first suspension and identical on every replay.
        at = ex.begin("signal_deadline", name)
        if at.recorded is not None:
            deadline = float(ex.replay(at, float))
        else:
            deadline = float(ex.complete_call(at, time.time() + timeout, float))
    call = ex.begin("signal", name)
    if call.recorded is not None:
        return _replayed(ex, call, name, type_)
    message = ex.next_delivery(key)
    if message is not None:
        return _take(ex, call, message, name, type_)
    if deadline is not None and time.time() >= deadline:
        error = {"type": "SignalTimeout", "message": str(SignalTimeout(name, timeout)), "timeout": timeout,
                 "deadline": deadline}
        ex.append(ex.entry(EventType.STEP_FAILED, position=call.position, step_kind=call.kind, name=name,
                           attempt=1, started_at=call.started_at, detail={"error": error}))
        raise SignalTimeout(name, timeout)
    # Parks the run; the store makes it runnable at once if a message for
    # ``key`` arrived since ``next_delivery`` looked (no lost wake-up).
    raise Suspend("signal", wake_at=deadline, waiting_for=key, detail={"signal": name})


def _take(ex: Execution, call: Call, message: Delivery, name: str, type_: Any) -> Any:
    try:
        raw = ex.runtime.payloads.raw(message.payload, what=f"signal {name!r}") \
            if message.payload is not None else b"null"
    except INFRASTRUCTURE_ERRORS as exc:
        raise Abandon(f"cannot load signal {name!r} of run {ex.run_id}: {exc}") from exc
    try:
        value = values.decode(raw, type_, what=f"signal {name!r}")
    except PayloadError as exc:
        rejected = InvalidSignal(name, str(exc), seq=message.seq, sender=message.sender)
        ex.take_delivery(call, message, None, error=error_detail(rejected, problem=str(exc)))
        raise rejected from None
    # The message's own bytes are the record: replay decodes them with the
    # same type, so it returns what this execution returns.
    ex.take_delivery(call, message, message.payload)
    return value


def _replayed(ex: Execution, call: Call, name: str, type_: Any) -> Any:
    recorded = call.recorded
    assert recorded is not None
    if recorded.event is EventType.STEP_FAILED:
        detail = recorded.detail or {}
        error = detail.get("error") or {}
        if error.get("type") == "SignalTimeout":
            raise SignalTimeout(name, error.get("timeout"))
        raise InvalidSignal(name, str(error.get("problem") or error.get("message") or ""),
                            seq=detail.get("delivery"), sender=detail.get("sender"))
    return ex.replay(call, type_)


# -- sending ----------------------------------------------------------------------------------


def send(ex: Execution, run_id: str, name: str, data: Any) -> int:
    """``ctx.signal``: deliver signal ``name`` with ``data`` to run ``run_id``,
    exactly once; returns the message's ``seq`` in the receiver's mailbox."""
    key = signal_key(name)
    if not isinstance(run_id, str) or not run_id:
        raise InvalidArgument(f"a run id must be a non-empty string, not {run_id!r}")
    raw = values.encode(data)  # refused before anything is recorded (NaN, secrets, ...)
    call = ex.begin("send_signal", name, input_hash((run_id,), {"data": values.decode(raw)}))
    if call.recorded is not None:
        if call.recorded.event is EventType.STEP_FAILED:
            error = (call.recorded.detail or {}).get("error") or {}
            raise SignalRefused(run_id, str(error.get("message", "")))
        return int(ex.replay(call, int))
    dedupe = operation_id(ex.run_id, call.position, ex.journal.generation(call.position))
    try:
        seq = _deliver(ex, run_id, key, raw, dedupe)
        fault_point("signal.after_deliver")
    except (RunNotFound, InvalidRunState) as exc:
        refused = SignalRefused(run_id, str(exc))
        ex.append(ex.entry(EventType.STEP_FAILED, position=call.position, step_kind=call.kind, name=name,
                           input_hash=call.input_hash, attempt=1, started_at=call.started_at,
                           detail={"error": error_detail(refused), "target": run_id}))
        raise refused from None
    ex.complete_call(call, seq, int, detail={"target": run_id, "dedupe": dedupe})
    return seq


def _deliver(ex: Execution, run_id: str, key: str, raw: bytes, dedupe: str) -> int:
    store = ex.store
    try:
        target = store.get_run(run_id)
        # A run of another tenant is reported exactly as an unknown one: on
        # SQLite nothing else hides it, and a worker's role on PostgreSQL
        # may see every tenant.
        if target is None or target.tenant != ex.run.tenant:
            raise RunNotFound(run_id)
        payload = ex.runtime.payloads.wrap(raw)
        # Re-executed after a crash, to a run that has finished since: the
        # store returns what was delivered the first time (same dedupe key).
        delivery, _ = store.deliver(run_id, key, payload, sender=f"run:{ex.run_id}", dedupe=dedupe)
        return delivery.seq
    except INFRASTRUCTURE_ERRORS as exc:
        raise Abandon(f"cannot deliver signal to run {run_id}: {exc}") from exc


# -- published events ----------------------------------------------------------------------------


def publish(ex: Execution, key: str, value: Any) -> None:
    """``ctx.set_event``: record ``value`` as the latest under ``key``."""
    check_name("an event key", key)
    call = ex.begin("event", key)
    if call.recorded is not None:
        return
    ex.complete_call(call, value, Any)


def read_event(ex: Execution, run_id: str, key: str, type_: Any) -> Any:
    """``ctx.get_event``: what run ``run_id`` published last under ``key``
    (``None``: nothing yet), read once and journaled."""
    check_name("an event key", key)
    call = ex.begin("get_event", key, input_hash((run_id,), {}))
    if call.recorded is not None:
        if call.recorded.event is EventType.STEP_FAILED:
            raise RunNotFound(run_id)
        if not (call.recorded.detail or {}).get("found"):
            return None
        return ex.replay(call, type_)
    try:
        target = ex.store.get_run(run_id)
        event = ex.store.latest_event(run_id, key) if target is not None else None
    except INFRASTRUCTURE_ERRORS as exc:
        raise Abandon(f"cannot read event {key!r} of run {run_id}: {exc}") from exc
    if target is None or target.tenant != ex.run.tenant:
        ex.append(ex.entry(EventType.STEP_FAILED, position=call.position, step_kind=call.kind, name=key,
                           input_hash=call.input_hash, attempt=1, started_at=call.started_at,
                           detail={"error": error_detail(RunNotFound(run_id)), "run": run_id}))
        raise RunNotFound(run_id)
    if event is None:
        ex.record_outcome(call, None, {"run": run_id, "found": False})
        return None
    # Recorded before it is decoded: a value that does not fit ``type_`` fails
    # this call the same way on every replay, whatever the run publishes later.
    ex.record_outcome(call, event.payload, {"run": run_id, "found": True, "seq": event.seq})
    call.recorded = ex.journal.outcomes[call.position]
    return ex.replay(call, type_)
