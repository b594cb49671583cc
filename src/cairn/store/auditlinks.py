"""The audit chain's links: one SHA-256 per history entry, chaining the
run's entries in ``seq`` order (issue 26, docs/design.md "Audit chain").

``link(n) = SHA-256(link(n-1) || canonical(entry n))``, with 32 zero bytes
before a run's first entry. ``canonical`` is the entry's row exactly as it is
stored: every column of ``history`` in ``AUDIT_COLUMNS`` order, each value
tagged by its type (NULL, 64-bit integer, IEEE double, UTF-8 text, bytes)
and length-prefixed, so no two different rows encode the same. The payload is
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
import struct
from collections.abc import Sequence
from typing import Any

#: The columns of ``history`` a link covers, in the order they are encoded.
AUDIT_COLUMNS = (
    "run_id", "seq", "tenant", "event", "at", "epoch", "worker", "position", "step_kind", "name",
    "input_hash", "attempt", "started_at", "payload", "payload_ref", "detail",
)

#: The link before a run's first entry.
GENESIS = bytes(32)

_NULL = b"\x00"
_INT = struct.Struct(">cq")
_FLOAT = struct.Struct(">cd")
_LEN = struct.Struct(">cI")


def canonical(values: Sequence[Any]) -> bytes:
    """The bytes a link covers for one stored row (``AUDIT_COLUMNS`` order).
    A value of a type no column holds (a damaged row) still encodes,
    as its text, so verification reports it instead of failing."""
    parts: list[bytes] = []
    append = parts.append
    for value in values:
        kind = type(value)
        if value is None:
            append(_NULL)
        elif kind is str:
            data = value.encode("utf-8", "surrogatepass")
            append(_LEN.pack(b"\x03", len(data)))
            append(data)
        elif kind is int:
            append(_INT.pack(b"\x01", value) if -(2**63) <= value < 2**63 else _text(str(value)))
        elif kind is float:
            append(_FLOAT.pack(b"\x02", value))
        elif kind is bytes or kind is memoryview or kind is bytearray:
            data = bytes(value)
            append(_LEN.pack(b"\x04", len(data)))
            append(data)
        else:
            append(_text(repr(value)))
    return b"".join(parts)


def _text(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return _LEN.pack(b"\x03", len(data)) + data


def link(previous: bytes | None, values: Sequence[Any]) -> bytes:
    """The link of a row whose predecessor's link is ``previous`` (``None``: the first)."""
    return hashlib.sha256((previous or GENESIS) + canonical(values)).digest()


def sqlite_link(previous: bytes | None, *values: Any) -> bytes:
    """``link`` as SQLite calls it from the trigger (``cairn_audit_link``)."""
    return hashlib.sha256((previous or GENESIS) + canonical(values)).digest()


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
