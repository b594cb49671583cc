"""A journaled step's entry, sealed and digested in one pass: ``SealedStore.append``.

A step's entry (one entry, a payload, no detail) is what a run appends most,
and what encryption at rest adds to it is mostly Python around two C calls
(the AES-GCM of its payload, the HMAC of its audit digest): each Python call
is about a microsecond of a journaled step, as much as the AES-GCM of a
kilobyte (bench/encryption.py, ``--instructions``). So the common case is
written out here in the one method the engine calls, with what it needs read
from ``SealedStore._hot`` in one attribute lookup (every lookup on a
``SealedStore`` goes through its ``__getattr__`` hook, which the interpreter
cannot specialize):

- the payload sealed as ``Sealer.seal_at`` seals it (the same envelope,
  bound to the same place: tenant, run, ``history``, ``seq N``,
  ``payload``) with the tenant's writing key as ``DataKeys.writing`` caches
  it, a payload of ``COMPRESS_AT`` bytes or more compressed first
  (``envelope.compress``); any other case (a run with a subject, no key
  cached or its ``KEY_REFRESH_SECONDS`` past, a tenant whose audit key is
  not derived yet) goes through ``seal_at`` and ``AuditKeys.sealed``
  themselves, which load or refresh what is cached;
- its audit digest keyed from the plaintext at hand, as ``AuditKey.digest``
  keys it (keyed BLAKE2b-256, a copy of the tenant's keyed state,
  ``AuditKeys.keyed``), and left in ``AuditKeys.known`` for the store, which
  asks for it (``audit_digest``) as it writes the entry;
- the sealed bytes swapped into the caller's payload for the inner store's
  call and put back after, whatever happens, rather than a copy of the
  entry's 14 fields or a new ``Payload`` (1,200 instructions a step). The
  entry and its payload are the engine's (``Execution.record_outcome``,
  ``PayloadCodec.wrap``), built for this append and read by no other thread
  meanwhile.

Anything else (several entries, a detail, an artifact's payload, a run whose
tenant this store has not seen) is sealed entry by entry (``_seal_events``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import monotonic as _monotonic
from typing import TYPE_CHECKING, Any, Protocol

from cairn.security.envelope import (
    COMPRESS_AT,
    FLAG_ZLIB,
    compress,
    encode_place,
    fresh_nonce,
    header,
    take_nonce,
)
from cairn.store import sealing
from cairn.store.auditkeys import PLAIN_KEPT, encode_digested
from cairn.store.records import HistoryEvent

if TYPE_CHECKING:
    import hashlib

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from cairn.store.contract import Store

#: what a step's sealing reads of ``SealedStore`` in one lookup (``SealedStore._hot``): its
#: runs' tenants, the tenants' writing keys, the runs' subjects, the audit keys' keyed states and
#: their known digests, ``Sealer.seal_at``, ``AuditKeys.sealed`` and the inner store
Hot = tuple[
    dict[str, str], dict[str, "tuple[int, AESGCM, bytes, float]"], dict[str, str | None],
    dict[str, "hashlib.blake2b"], dict[int, tuple[HistoryEvent, bytes]],
    Callable[[str, str, str, str, str, bytes], bytes], Callable[[HistoryEvent, str, bytes, Any], None],
    "Store",
]


class HotStore(Protocol):
    """What ``append`` needs of ``SealedStore`` (named here, not imported:
    ``cairn.store.sealed`` imports this module)."""

    _hot: Hot

    def _seal_event(self, tenant: str, event: HistoryEvent) -> HistoryEvent: ...

    def _seal_events(self, run_id: str, events: Sequence[HistoryEvent]) -> list[HistoryEvent]: ...

#: ``Sealer.seal_at``'s mark of a run whose subject it does not know yet
_UNKNOWN = sealing.UNKNOWN_SUBJECT


def append(store: HotStore, run_id: str, epoch: int, events: Sequence[HistoryEvent], *,
           barrier: bool = False) -> None:
    """``Store.append`` with the entries' values sealed (see the module doc)."""
    tenants, writing, subjects, keyeds, known, seal_at, digested, inner = store._hot
    tenant = tenants.get(run_id)
    if tenant is None or len(events) != 1:
        inner.append(run_id, epoch, store._seal_events(run_id, events), barrier=barrier)
        return
    event = events[0]
    given = event.payload
    if given is None or event.detail or (data := given.data) is None:
        inner.append(run_id, epoch, [store._seal_event(tenant, event)], barrier=barrier)
        return
    key = writing.get(tenant)
    audit = keyeds.get(tenant)
    run = event.run_id  # its place's run (the inner store refuses it if it is not ``run_id``)
    if (key is not None and audit is not None
            and subjects.get(run, _UNKNOWN) is None and _monotonic() - key[3] <= sealing.KEY_REFRESH_SECONDS):
        head, plain = key[2], data
        if len(data) >= COMPRESS_AT:  # compressed first, as ``envelope.seal`` would (issue 25, 2026-12-07)
            packed = compress(data)
            if len(packed) < len(data):
                plain, head = packed, header(FLAG_ZLIB, key[0], tenant)
        try:
            nonce = take_nonce()
        except IndexError:
            nonce = fresh_nonce()
        sealed = head + nonce + key[1].encrypt(
            nonce, plain, head + encode_place((tenant, run, "history", f"seq {event.seq}", "payload")))
        keyed = audit.copy()
        keyed.update(encode_digested((data, None)))
        if len(known) >= PLAIN_KEPT:
            known.clear()
        known[id(event)] = (event, keyed.digest())
    else:
        sealed = seal_at(tenant, run, "history", f"seq {event.seq}", "payload", data)
        digested(event, tenant, data, None)
    given.data = sealed
    try:
        inner.append(run_id, epoch, events, barrier=barrier)
    finally:
        given.data = data
