"""The tenants' audit keys and the keyed digest of a sealed entry (issue 26).

With encryption on, an entry's audit digest is HMAC-SHA-256 under its
tenant's audit key (``auditlinks.AuditKey``), not a plain hash a reader of
the database could test a guessed plaintext against. The audit key is
derived from the tenant's data key version 1, unwrapped by the keyring:

    audit key = HMAC-SHA-256(data key 1, "cairn audit digest" || 0x00 || tenant)

and the digest is keyed BLAKE2b-256 under it (``AuditKey.digest``; entries
written before 2026-12-06 hold HMAC-SHA-256, still verified: ``earlier``),
so it is the same before and after any rotation (a newer data key seals
new writes; version 1 stays stored while anything it sealed or digested
does), is never the data key itself, and is gone when the tenant's keys are
destroyed (crypto-shredding): its entries can then no longer be opened nor
their digests recomputed, and ``KeyGone`` tells the verifier so: erased, not
tampered, their stored digests still checked in the links.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from cairn.security.envelope import SealError, is_envelope
from cairn.store import auditlinks
from cairn.store.auditlinks import AuditKey
from cairn.store.keysql import SUBJECT_KEY_BASE
from cairn.store.records import HistoryEvent
from cairn.store.rekey import REASON_PREFIX
from cairn.store.sealing import DataKeys, KeyErased

#: the data key version an audit key is derived from
AUDIT_KEY_VERSION = 1
_LABEL = b"cairn audit digest\x00"

#: opens an entry of a tenant: its payload bytes and detail in plaintext
Open = Callable[[HistoryEvent, "str | None"], "tuple[bytes | None, Any]"]
#: how many entries sealed but not yet digested an ``AuditKeys`` keeps the digest of (``sealed``)
PLAIN_KEPT = 256
#: what an entry's digest covers, encoded as ``auditlinks.digest`` and ``AuditKey.digest`` encode it
#: (MessagePack, maps by sorted key): for ``cairn.store.sealedsteps``, which keys it inline
encode_digested = msgspec.msgpack.Encoder(order="sorted").encode

if TYPE_CHECKING:
    import hashlib


class KeyGone(SealError):
    """An entry's key is no longer stored: its data key or its tenant's
    audit key was destroyed (erased), so nothing about its content can be
    checked."""


class AuditKeys:
    """The audit keys of a sealed store's tenants, derived once per process,
    and the keyed digest of an entry (``digest``, the store's ``audit_digest``)."""

    def __init__(self, store: Any, keys: DataKeys, open_entry: Open,
                 tenant_of: Callable[[str], str]) -> None:
        self._store = store
        self._data_keys = keys
        self._open = open_entry
        self._tenant_of = tenant_of
        self._keys: dict[str, AuditKey] = {}
        #: tenant -> when its data key 1 was made (``written_before_keys``)
        self._created: dict[str, float] = {}
        #: id of an entry this process sealed -> (that entry, its keyed digest, from its plaintext)
        self.known: dict[int, tuple[HistoryEvent, bytes]] = {}
        #: tenant -> its audit key's keyed BLAKE2b state (``AuditKey.keyed``): ``cairn.store.sealedsteps``
        #: keys a step's digest from it without a call
        self.keyed: dict[str, hashlib.blake2b] = {}
        self._lock = threading.Lock()

    def sealed(self, event: HistoryEvent, tenant: str, data: bytes, detail: Any) -> None:
        """Remember that ``event``, just sealed by this process, holds ``data``
        (its payload's plaintext) and ``detail`` (left unsealed): its digest is
        keyed from them now, and handed to the store when it asks for it a
        moment later as it writes the entry, instead of decrypting what was
        just encrypted (an AES-GCM open and its Python per journaled step: the
        largest single cost encryption added to a step) or looking the entry
        over again. Known by the entry object itself, which the map holds (so
        its id cannot be reused while it is there); an entry the store never
        digests is forgotten within ``PLAIN_KEPT`` others. A row read back
        from the database is never found here: its digest is of what it opens
        to, at its place."""
        key = self._keys.get(tenant)
        if key is None:
            key = self.key(tenant)
        plain = self.known
        if len(plain) >= PLAIN_KEPT:
            plain.clear()
        plain[id(event)] = (event, key.digest(data, detail))

    def key(self, tenant: str) -> AuditKey:
        """``tenant``'s audit key; ``KeyGone`` if its data key 1 is not stored
        (read from the database, not the keys this process has cached: an
        erasure is seen at once). Derived by ``DataKeys.subkey``."""
        known = self._keys.get(tenant)
        if known is not None:
            return known
        with self._lock:
            row = next((r for r in self._store.data_keys(tenant) if r.version == AUDIT_KEY_VERSION), None)
            if row is None:
                raise KeyGone(f"the audit key of tenant {tenant!r} is gone (its data key "
                              f"{AUDIT_KEY_VERSION} was destroyed)")
            key = self._keys[tenant] = AuditKey(self._data_keys.subkey(
                tenant, _LABEL + tenant.encode(), version=AUDIT_KEY_VERSION))
            self.keyed[tenant] = key.keyed  # its own, never updated: copied per digest
        return key

    def digest(self, event: HistoryEvent, tenant: str | None) -> bytes:
        """The digest of ``event`` as stored: keyed if it holds a sealed
        value (its plaintext is what the digest must not give away), plain
        SHA-256 if it holds none (a lifecycle entry's detail is stored in
        the clear: nothing to hide, and no key needed, so a process with a
        wrong keyring can still claim and park a run). ``KeyGone`` if a key
        it needs was destroyed, another ``SealError`` if it does not open
        under a key that is stored (edited)."""
        known = self.known.pop(id(event), None)
        if known is not None and known[0] is event:
            return known[1]
        payload, detail = event.payload, event.detail
        if (payload is None or payload.data is None) and (detail is None or not _sealed_detail(detail)):
            return auditlinks.digest(None, detail)  # a lifecycle entry's without a detail: no call more
        tenant = tenant if tenant is not None else self._tenant_of(event.run_id)
        data, opened = self._opened(event, tenant)
        return self.key(tenant).digest(data, opened)

    def earlier(self, event: HistoryEvent, tenant: str) -> bytes | None:
        """The keyed digest ``event`` had if it was written before version 2
        (``AuditKey.digest_v1``, HMAC-SHA-256), for the verifier to try when
        ``digest`` differs from the stored one; ``None`` for an entry that
        holds no sealed value (its digest is plain, in every version)."""
        payload, detail = event.payload, event.detail
        if (payload is None or payload.data is None) and (detail is None or not _sealed_detail(detail)):
            return None
        data, opened = self._opened(event, tenant)
        return self.key(tenant).digest_v1(data, opened)

    def _opened(self, event: HistoryEvent, tenant: str) -> tuple[bytes | None, Any]:
        """``event``'s payload bytes and detail opened; ``KeyGone`` if a key it needs was destroyed."""
        try:
            return self._open(event, tenant)
        except KeyGone:
            raise
        except KeyErased as exc:
            raise KeyGone(f"a key of entry {event.seq} is gone (erased): {exc}") from None
        except SealError as exc:
            if self._erased(tenant, event):
                raise KeyGone(f"a key of entry {event.seq} is gone (erased): {exc}") from None
            raise

    def plain_before_keys(self, event: HistoryEvent, tenant: str, version: int = 2) -> bytes | None:
        """The plain digest of ``event`` (of the formula its link's ``version``
        covers: ``auditlinks.plain_digest``) if it was written before its
        tenant's first data key (so before its audit key), else ``None``: its
        digest was plain then, and ``cairn keys adopt`` sealed it keeping
        the digest. The verifier accepts a plain digest for such an entry
        only; every write after the key is keyed."""
        created = self._created.get(tenant)
        if created is None:
            row = next((r for r in self._store.data_keys(tenant) if r.version == AUDIT_KEY_VERSION), None)
            if row is None:
                return None
            created = self._created[tenant] = row.created_at
        if float(event.at) >= created:
            return None
        data, detail = self._open(event, tenant)
        return auditlinks.plain_digest(data, detail, version)

    def _erased(self, tenant: str, event: HistoryEvent) -> bool:
        """Whether ``event`` was sealed with a data key that was destroyed (the
        stored keys read afresh, not those this process cached): the tenant
        has none left, or the envelope names a version below its newest that
        is gone, or a subject's key that was destroyed (its tombstone, or its
        secret gone). A version above the newest never existed: an edited
        header, not an erasure."""
        rows = self._store.data_keys(tenant)
        erased = {row.version for row in rows if row.erased}
        stored = {row.version for row in rows if row.version < SUBJECT_KEY_BASE}
        if not stored:
            return True
        sealed = [None if event.payload is None else event.payload.data]
        if isinstance(event.detail, dict) and isinstance(event.detail.get("sealed"), str):
            with contextlib.suppress(binascii.Error, ValueError):
                sealed.append(base64.b64decode(event.detail["sealed"], validate=True))
        versions = [int.from_bytes(data[4:8], "big") for data in sealed
                    if data is not None and is_envelope(data)]
        return any(v in erased or (v not in stored and 0 < v < max(stored)) for v in versions)


def _sealed_detail(detail: Any) -> bool:
    """Whether an entry's stored detail holds a sealed value (``Sealer.seal_json``, ``seal_text``).
    A loop, not ``any`` over a generator: asked of every lifecycle entry's detail as it is
    written, and a generator is a frame more."""
    if not isinstance(detail, dict):
        return False
    if "sealed" in detail:
        return True
    for value in detail.values():  # noqa: SIM110 (not ``any``: see the docstring)
        if isinstance(value, str) and value.startswith(REASON_PREFIX):
            return True
    return False
