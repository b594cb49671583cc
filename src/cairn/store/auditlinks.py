"""The audit chain's links: one SHA-256 per history entry, chaining the
run's entries in ``seq`` order (issue 26, docs/design.md "Audit chain").

``link(n) = SHA-256(link(n-1) || canonical(entry n))``, with 32 zero bytes
before a run's first entry. ``canonical`` is the entry's row exactly as it is
stored: every column of ``history`` in ``AUDIT_COLUMNS`` order, as one
MessagePack array (each value tagged by its type, text and bytes
length-prefixed), so no two different rows encode the same. The payload is
the stored (packed, later encrypted) bytes, never the decoded value: erasing
a subject's key leaves every link verifiable. The actor is in the row (the
``worker`` and ``epoch`` of a lease holder's entry, ``detail.actor`` of an
operator's), so forging one breaks the link like any other edit.

The database computes the links, in the transaction that writes the entry:
on PostgreSQL a trigger in the schema (migration 0032, ``sha256``), on
SQLite a ``TEMP`` trigger each write connection carries (``TRIGGERS``)
calling ``sqlite_link`` (a Python function; SQLite has no SHA-256). Every
statement that inserts an entry is covered, whatever path it takes, and the
row hashed is the row written. ``canonical`` here is the one the verifier
recomputes (``cairn.api.audit``); PostgreSQL's SQL builds the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec

#: The columns of ``history`` a link covers, in the order they are encoded.
AUDIT_COLUMNS = (
    "run_id", "seq", "tenant", "event", "at", "epoch", "worker", "position", "step_kind", "name",
    "input_hash", "attempt", "started_at", "payload", "payload_ref", "detail",
)

#: The link before a run's first entry.
GENESIS = bytes(32)

_ENCODE = msgspec.msgpack.Encoder().encode


def canonical(values: Sequence[Any]) -> bytes:
    """The bytes a link covers for one stored row (``AUDIT_COLUMNS`` order):
    the row as a MessagePack array, each value in the smallest form its type
    takes (integers by magnitude, every float as a 64-bit double, text and
    bytes length-prefixed), which is one encoding per row and cheap (C); the
    PostgreSQL migration builds the same bytes in SQL. A value of a type no
    column holds (a damaged row) encodes as its text, so verification
    reports it instead of failing."""
    try:
        return _ENCODE(values if type(values) is tuple else tuple(values))
    except (TypeError, OverflowError):
        return _ENCODE(tuple(_plain(v) for v in values))


def _plain(value: Any) -> Any:
    """A stored value as ``canonical`` encodes it: bytes however the driver
    returned them; anything no column holds as its text."""
    kind = type(value)
    if kind is memoryview or kind is bytearray:
        return bytes(value)
    if value is None or kind in (str, float, bytes) or (kind is int and -(2**63) <= value < 2**64):
        return value
    return repr(value)


def link(previous: bytes | None, values: Sequence[Any]) -> bytes:
    """The link of a row whose predecessor's link is ``previous`` (``None``: the first)."""
    return hashlib.sha256((previous or GENESIS) + canonical(values)).digest()


def sqlite_link(previous: bytes | None, *values: Any) -> bytes:
    """``link`` as SQLite calls it from the trigger (``cairn_audit_link``)."""
    try:
        data = _ENCODE(values)
    except (TypeError, OverflowError):
        data = canonical(values)
    return hashlib.sha256((previous or GENESIS) + data).digest()


#: The stored payload of a SQLite row, a spilled one read back from
#: ``history_payloads`` (what the link covers is the payload, not its link tag).
_PAYLOAD = ("CASE WHEN substr(NEW.payload, 1, 2) = X'0002' THEN (SELECT p.data FROM main.history_payloads "
            "AS p WHERE p.id = CAST(substr(NEW.payload, 3) AS INTEGER)) ELSE NEW.payload END")

#: The trigger of one SQLite write connection: each entry inserted gets its
#: link in the same statement (and so the same transaction).
TRIGGERS = (
    "CREATE TEMP TRIGGER IF NOT EXISTS cairn_audit_link AFTER INSERT ON main.history FOR EACH ROW BEGIN "
    "INSERT INTO audit_links (run_id, seq, tenant, link) VALUES (NEW.run_id, NEW.seq, NEW.tenant, "
    "cairn_audit_link((SELECT l.link FROM main.audit_links AS l WHERE l.run_id = NEW.run_id "
    "AND l.seq < NEW.seq ORDER BY l.seq DESC LIMIT 1), NEW.run_id, NEW.seq, NEW.tenant, NEW.event, NEW.at, "
    "NEW.epoch, NEW.worker, NEW.position, NEW.step_kind, NEW.name, NEW.input_hash, NEW.attempt, "
    "NEW.started_at, " + _PAYLOAD + ", NEW.payload_ref, NEW.detail)); END",
)
