"""Records of the memory tiers, as the store reads and writes them.

Like ``records``, these hold bytes and plain values only (a value is a codec
``Payload``; a namespace is its stored text, ``store.namespaces``): the
store never sees user objects. A *write* is one change to one tier; a batch
of writes is applied in one transaction, with the journal entry of the step
that made them (``Store.append_memory``) or on its own for an operator
(``Store.write_memory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cairn.store.records import Payload


@dataclass(frozen=True, slots=True)
class Provenance:
    """Who wrote a memory: the run, position and operation of the step (inside
    a run), or the operator's ``actor`` (outside one)."""

    run_id: str | None = None
    position: int | None = None
    operation_id: str | None = None
    actor: str | None = None
    #: whose data the writes are (erasure by subject); ``None``: the run's
    #: subject (inside a run) or none. A write's own ``subject`` comes first.
    subject: str | None = None


@dataclass(frozen=True, slots=True)
class ItemPut:
    """Put a long-term item (a new version of it). ``index_text``: the text
    to embed (an outbox row is written with the item); ``None``: not
    searchable. ``ttl``: seconds until it expires (``None``: never)."""

    namespace: str
    key: str
    value: Payload
    metadata: dict[str, Any] | None = None
    index_text: str | None = None
    ttl: float | None = None
    #: whose data the item is (``None``: the provenance's, else the run's)
    subject: str | None = None


@dataclass(frozen=True, slots=True)
class ItemDelete:
    namespace: str
    key: str


@dataclass(frozen=True, slots=True)
class RunPut:
    """Put a key of the writing run's own memory."""

    key: str
    value: Payload


@dataclass(frozen=True, slots=True)
class RunDelete:
    key: str


@dataclass(frozen=True, slots=True)
class ThreadAppend:
    """Append messages to a thread, in order. ``ttl`` (seconds) is the
    thread's retention from now on (``None``: keep the thread's own)."""

    thread_id: str
    messages: tuple[Payload, ...]
    ttl: float | None = None
    #: whose data the messages are (``None``: the provenance's, else the run's)
    subject: str | None = None


@dataclass(frozen=True, slots=True)
class ThreadCompact:
    """Replace the thread's messages with index < ``upto`` by one summary
    message, at index ``upto - 1`` (the order of the rest is kept)."""

    thread_id: str
    upto: int
    summary: Payload


MemoryWrite = ItemPut | ItemDelete | RunPut | RunDelete | ThreadAppend | ThreadCompact


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """A long-term item as stored (``namespace`` is its stored text)."""

    tenant: str
    namespace: str
    key: str
    value: Payload
    metadata: dict[str, Any] | None
    index_text: str | None
    version: int
    created_at: float
    updated_at: float
    accessed_at: float
    ttl: float | None
    expires_at: float | None
    provenance: Provenance
    tier: str = "hot"


@dataclass(frozen=True, slots=True)
class ThreadMessage:
    """One message of a thread; ``kind`` is ``message`` or ``summary``."""

    tenant: str
    thread_id: str
    index: int
    kind: str
    value: Payload
    created_at: float
    provenance: Provenance


@dataclass(frozen=True, slots=True)
class RunMemory:
    """One key of a run's own memory."""

    run_id: str
    tenant: str
    key: str
    value: Payload
    version: int
    created_at: float
    updated_at: float
    provenance: Provenance


@dataclass(frozen=True, slots=True)
class MemoryScope:
    """What a deletion (or a listing) covers, within one tenant (``None``:
    every tenant, the operator's). Deleting with nothing else set deletes
    all of the tenant's memory; ``namespace`` is a stored prefix ("" for
    every namespace), with ``key`` one item under exactly that namespace."""

    tenant: str | None
    namespace: str | None = None
    key: str | None = None
    thread_id: str | None = None
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class ItemTierUsage:
    """Long-term items of one tier and the bytes of their values: ``bytes``
    as stored (hot: inline bytes, offloaded values being in the artifact
    store; cold: compressed), ``raw_bytes`` what they decode to."""

    tier: str  # 'hot' | 'cold'
    items: int
    bytes: int
    raw_bytes: int


@dataclass(frozen=True, slots=True)
class ItemTierMove:
    """What a tiering pass of item values did (``Store.tier_items``)."""

    cooled: int
    rewarmed: int


__all__ = [
    "ItemDelete",
    "ItemPut",
    "ItemTierMove",
    "ItemTierUsage",
    "MemoryItem",
    "MemoryScope",
    "MemoryWrite",
    "Provenance",
    "RunDelete",
    "RunMemory",
    "RunPut",
    "ThreadAppend",
    "ThreadCompact",
    "ThreadMessage",
]
