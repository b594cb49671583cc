"""The keys and the sealing of ``cairn.store.sealed``: data keys per tenant
and version (created, unwrapped with the keyring, cached), and the sealing
and opening of bytes, JSON columns and operator text at their places.

Kept apart from the store wrapper so that each reads on its own: this module
knows keys and envelopes, ``sealed`` knows which value of which record goes
to which place.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
import time
from collections import OrderedDict
from os import urandom as _urandom
from typing import TYPE_CHECKING, Any

import msgspec

from cairn.security.envelope import (
    COMPRESS_AT,
    KEY_SIZE,
    NONCE_SIZE,
    Place,
    SealError,
    aesgcm,
    encode_place,
    header,
    header_of,
    is_envelope,
    nonce_key,
    open_sealed,
    seal,
)
from cairn.security.keyring import Keyring
from cairn.store.keysql import DataKeyRow
from cairn.store.records import Payload
from cairn.store.rekey import BESIDE_SEALED, PLAIN_DETAIL, REASON_PREFIX, reason_place
from cairn.store.retention import EXPIRED_TAG

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: the ``data_keys`` row (tenant, version) that says an existing database is being sealed
ADOPTION = ("", 0)
ADOPTION_CONTEXT = b"cairn adoption of a plaintext database"
#: how long a process seals with the newest data key it knows before looking for a newer one
KEY_REFRESH_SECONDS = 5.0

_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()


def context(tenant: str, version: int) -> bytes:
    """What a wrapped data key is bound to: its tenant and version."""
    return tenant.encode() + b"\x00" + str(version).encode()


class DataKeys:
    """The tenants' data keys: created, unwrapped and cached per process.

    The newest version of a tenant seals its new writes; any stored version
    opens what it sealed. A tenant's first sealed write creates version 1
    (insert-if-absent: concurrent writers agree on one key)."""

    def __init__(self, store: Any, keyring: Keyring) -> None:
        self._store = store
        self.keyring = keyring
        self._ciphers: dict[tuple[str, int], AESGCM] = {}
        self._nonce_keys: dict[tuple[str, int], bytes] = {}
        self._adopting: tuple[bool, float] | None = None
        #: tenant -> (its newest version, that key's cipher, when that was looked up)
        self._newest: dict[str, tuple[int, AESGCM, float]] = {}
        #: tenant -> (version, cipher, envelope header, when looked up): ``Sealer.seal_at``'s
        #: cache of the writing key, forgotten when a key is added or a newer one found
        self.writing: dict[str, tuple[int, AESGCM, bytes, float]] = {}
        self._lock = threading.Lock()

    def _unwrap(self, row: DataKeyRow) -> AESGCM:
        try:
            key = self.keyring.unwrap(row.kek_id, row.wrapped, context(row.tenant, row.version))
        except SealError as exc:
            raise SealError(f"data key {row.version} of tenant {row.tenant!r}: {exc}") from None
        self._nonce_keys[(row.tenant, row.version)] = nonce_key(key)
        return aesgcm(key)

    def nonce_key(self, tenant: str, version: int) -> bytes:
        """The synthetic-nonce key of a key ``writer`` or ``reader`` returned."""
        return self._nonce_keys[(tenant, version)]

    def tenants(self) -> list[str]:
        """Every tenant with a stored data key."""
        return sorted({row.tenant for row in self._store.data_keys(None) if row.tenant != ADOPTION[0]})

    # -- turning encryption on for an existing database ---------------------------------------

    def adopting(self) -> bool:
        """Whether plaintext values written before encryption was turned on
        are still being sealed (``cairn keys adopt``): only then is a value
        that is not an envelope read as it is. The marker is a ``data_keys``
        row wrapped by a KEK of this keyring: one planted without the KEK
        does not unwrap and is ignored. Looked up again every
        ``KEY_REFRESH_SECONDS``, so a worker turns strict soon after the
        adoption ends."""
        known = self._adopting
        if known is not None and time.monotonic() - known[1] <= KEY_REFRESH_SECONDS:
            return known[0]
        found = False
        for row in self._store.data_keys(ADOPTION[0]):
            if row.version == ADOPTION[1]:
                try:
                    found = self.keyring.unwrap(row.kek_id, row.wrapped, ADOPTION_CONTEXT) == ADOPTION_CONTEXT
                except SealError:
                    found = False
        self._adopting = (found, time.monotonic())
        return found

    def start_adoption(self) -> None:
        kek = self.keyring.current()
        wrapped = self.keyring.wrap(kek, ADOPTION_CONTEXT, ADOPTION_CONTEXT)
        self._store.add_data_key(DataKeyRow(ADOPTION[0], ADOPTION[1], kek, wrapped, time.time()))
        self._adopting = None

    def end_adoption(self) -> None:
        self._store.delete_data_key(*ADOPTION)
        self._adopting = None

    def _load(self, tenant: str) -> int:
        """Cache the tenant's stored keys; its newest version (0: none)."""
        newest = 0
        for row in self._store.data_keys(tenant):
            if (tenant, row.version) not in self._ciphers:
                self._ciphers[(tenant, row.version)] = self._unwrap(row)
            newest = max(newest, row.version)
        if newest:
            self._newest[tenant] = (newest, self._ciphers[(tenant, newest)], time.monotonic())
        known = self.writing.get(tenant)
        if known is not None and known[0] != newest:
            self.writing.pop(tenant, None)
        return newest

    def add(self, tenant: str) -> int:
        """Create the tenant's next key version (rotation); its number."""
        with self._lock:
            version = self._load(tenant) + 1
            kek = self.keyring.current()
            row = DataKeyRow(tenant, version, kek, self.keyring.wrap(kek, os.urandom(KEY_SIZE),
                                                                     context(tenant, version)), time.time())
            stored = self._store.add_data_key(row)
            cipher = self._ciphers[(tenant, version)] = self._unwrap(stored)
            self._newest[tenant] = (version, cipher, time.monotonic())
            self.writing.pop(tenant, None)
            return version

    def writer(self, tenant: str) -> tuple[int, AESGCM]:
        """The tenant's newest version and its cipher (created if none): one
        dictionary lookup per value sealed, the stored keys read again every
        ``KEY_REFRESH_SECONDS``."""
        known = self._newest.get(tenant)
        if known is not None and time.monotonic() - known[2] <= KEY_REFRESH_SECONDS:
            return known[0], known[1]
        with self._lock:
            version = self._load(tenant)
        if version == 0:
            version = self.add(tenant)
        return version, self._ciphers[(tenant, version)]

    def writing_key(self, tenant: str) -> tuple[int, AESGCM, bytes, float]:
        """``writer``'s key with its envelope header (uncompressed) and when
        the stored keys were last read, cached in ``writing`` until
        ``KEY_REFRESH_SECONDS`` after that reading."""
        version, cipher = self.writer(tenant)
        checked = self._newest[tenant][2]
        entry = self.writing[tenant] = (version, cipher, header(0, version, tenant), checked)
        return entry

    def reader(self, tenant: str, version: int, place: Place) -> AESGCM:
        cipher = self._ciphers.get((tenant, version))
        if cipher is None:
            with self._lock:
                self._load(tenant)
            cipher = self._ciphers.get((tenant, version))
            if cipher is None:
                raise SealError(f"{place} was sealed with data key {version} of tenant {tenant!r}, "
                                "which is not stored: refused")
        return cipher


class Sealer:
    """Seals and opens values and JSON columns at their places."""

    def __init__(self, keys: DataKeys) -> None:
        self.keys = keys
        #: the keys' own cache of writing keys (``DataKeys.writing``), shared
        self._writing = keys.writing
        #: artifact ref -> the tenant whose run named it when last read: a ref
        #: copied into another tenant's row is opened as that tenant's, and refused
        self.artifact_tenants: OrderedDict[str, str] = OrderedDict()

    def seal(self, place: Place, data: bytes) -> bytes:
        version, cipher = self.keys.writer(place.tenant)
        return seal(cipher, version, place, data)

    def seal_at(self, tenant: str, run: str, table: str, position: str, kind: str, data: bytes) -> bytes:
        """``seal(Place(tenant, run, table, position, kind), data)``, the same
        bytes, in one call for what a step journals: a small value (not to be
        compressed) sealed with the tenant's writing key without building a
        ``Place`` or going through ``writer`` and ``envelope.seal``. Each
        Python call is about a microsecond of a journaled step, as much as
        the AES-GCM of a kilobyte; ``bench/encryption.py`` measures it."""
        known = self._writing.get(tenant)
        if known is None or len(data) >= COMPRESS_AT or time.monotonic() - known[3] > KEY_REFRESH_SECONDS:
            if len(data) >= COMPRESS_AT:
                return self.seal(Place(tenant, run, table, position, kind), data)
            known = self.keys.writing_key(tenant)
        head = known[2]
        nonce = _urandom(NONCE_SIZE)
        return b"".join((head, nonce, known[1].encrypt(
            nonce, data, head + encode_place((tenant, run, table, position, kind)))))

    def open(self, place: Place, data: bytes) -> bytes:
        if not is_envelope(data) and self.keys.adopting():
            return data  # written before encryption was turned on, not sealed yet (``cairn keys adopt``)
        header = header_of(data, place)
        return open_sealed(self.keys.reader(place.tenant, header.key_version, place), header, place, data)

    def open_payload(self, place: Place, payload: Payload | None) -> Payload | None:
        if payload is None:
            return None
        if payload.data is None:
            if payload.ref is not None:  # its artifact opens only as this tenant's (``get_artifact``)
                self.artifact_tenants[payload.ref] = place.tenant
                if len(self.artifact_tenants) > 4096:
                    self.artifact_tenants.popitem(last=False)
            return payload
        if payload.data[:2] == EXPIRED_TAG:  # its body expired (store.retention): nothing sealed is left
            return payload
        return Payload(self.open(place, payload.data), payload.ref)

    def seal_json(self, place: Place, value: dict[str, Any] | None,
                  plain: frozenset[str] = PLAIN_DETAIL) -> dict[str, Any] | None:
        if value is None:
            return None
        kept = {k: v for k, v in value.items() if k in plain}
        rest = {k: v for k, v in value.items() if k not in plain}
        if rest:
            kept["sealed"] = base64.b64encode(self.seal(place, _ENCODE.encode(rest))).decode()
        return kept

    def seal_text(self, tenant: str, text: str) -> str:
        """Text an operator gives the store (a cancel or kill reason), sealed
        for the tenant: the store copies it into the error and the entry of
        every run the action reaches, so it is bound to the tenant and its
        kind (``operator``/``reason``), not to one run."""
        return REASON_PREFIX + base64.b64encode(self.seal(reason_place(tenant), text.encode())).decode()

    def open_text(self, tenant: str, text: str) -> str:
        try:
            data = base64.b64decode(text[len(REASON_PREFIX):], validate=True)
        except (binascii.Error, ValueError):
            data = b""
        return self.open(reason_place(tenant), data).decode()

    def open_json(self, place: Place, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """The value ``seal_json`` sealed, and any operator text in it
        (``seal_text``) opened. Beside ``"sealed"`` only the keys kept in
        plaintext on purpose are accepted (``BESIDE_SEALED`` in an entry's
        detail, none in a run's error). A value without ``"sealed"`` was
        written by the store itself (a status, an actor, a quarantine's
        cause) and is read as it is."""
        if not isinstance(value, dict):
            return value
        if any(isinstance(v, str) and v.startswith(REASON_PREFIX) for v in value.values()):
            value = {k: self.open_text(place.tenant, v) if isinstance(v, str) and v.startswith(REASON_PREFIX)
                     else v for k, v in value.items()}
        if "sealed" not in value:
            return value
        beside = set(value).difference(("sealed",), BESIDE_SEALED if place.table == "history" else ())
        if beside:  # no plaintext fallback: nothing is added to a sealed value unsealed
            raise SealError(f"{place} holds plaintext beside its sealed value ({', '.join(sorted(beside))}): "
                            "refused, encryption is on")
        sealed = value["sealed"]
        try:
            data = base64.b64decode(sealed, validate=True) if isinstance(sealed, str) else b""
        except (binascii.Error, ValueError):
            data = b""
        opened = _DECODE.decode(self.open(place, data))
        if not isinstance(opened, dict):
            raise SealError(f"{place} holds no JSON object")
        return {**{k: v for k, v in value.items() if k != "sealed"}, **opened}
