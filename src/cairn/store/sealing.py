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
import hashlib
import hmac
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from cairn.security.envelope import (
    COMPRESS_AT,
    FLAG_ZLIB,
    KEY_SIZE,
    Place,
    SealError,
    aesgcm,
    compress,
    encode_place,
    fresh_nonce,
    header,
    is_envelope,
    key_version,
    open_sealed,
    seal,
    take_nonce,
)
from cairn.security.keyring import Keyring
from cairn.security.shredding import shredder_of
from cairn.store.keysql import SUBJECT_KEY_BASE, DataKeyRow
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
#: ``DataKeys.subkey``'s purpose of the synthetic-nonce key (``envelope.synthetic_nonce``)
NONCE_PURPOSE = b"cairn synthetic nonce"
#: the data key version whose key derives a tenant's addresses (``KeyedAddresses``): a
#: tenant's first, never deleted by a rotation
ADDRESS_KEY_VERSION = 1

_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()
#: a run ``Sealer.seal_at`` does not know the subject of yet
UNKNOWN_SUBJECT: Any = object()
_UNKNOWN = UNKNOWN_SUBJECT


def context(tenant: str, version: int) -> bytes:
    """What a wrapped data key is bound to: its tenant and version."""
    return tenant.encode() + b"\x00" + str(version).encode()


def secret_name(tenant: str, version: int) -> str:
    """The name of a subject key's secret in the keyring's shredder: opaque
    (a digest of the tenant and version), so the secret file names nobody."""
    return hashlib.blake2b(b"cairn subject secret\x00" + context(tenant, version), digest_size=16).hexdigest()


class KeyErased(SealError):
    """A value sealed with a subject's data key that was destroyed (erasure):
    it can never be read again, from this database or any copy of it."""


class DataKeys:
    """The tenants' data keys: created, unwrapped and cached per process.

    The newest version of a tenant seals its new writes; any stored version
    opens what it sealed. A tenant's first sealed write creates version 1
    (insert-if-absent: concurrent writers agree on one key)."""

    def __init__(self, store: Any, keyring: Keyring) -> None:
        self._store = store
        self.keyring = keyring
        self._ciphers: dict[tuple[str, int], AESGCM] = {}
        #: (tenant, version) -> the data key itself, for ``subkey`` alone
        self._keys: dict[tuple[str, int], bytes] = {}
        #: (tenant, version, purpose) -> ``subkey``'s derived key
        self._subkeys: dict[tuple[str, int, tuple[bytes, ...]], bytes] = {}
        self._adopting: tuple[bool, float] | None = None
        #: tenant -> (its newest version, that key's cipher, when that was looked up)
        self._newest: dict[str, tuple[int, AESGCM, float]] = {}
        #: tenant -> (version, cipher, envelope header, when looked up): ``Sealer.seal_at``'s
        #: cache of the writing key, forgotten when a key is added or a newer one found
        self.writing: dict[str, tuple[int, AESGCM, bytes, float]] = {}
        #: (tenant, subject digest) -> (its live key version, cipher, when looked up)
        self._subjects: dict[tuple[str, str], tuple[int, AESGCM, float]] = {}
        #: (tenant, subject) -> its keyed digest (``subject_digest``)
        self._digests: dict[tuple[str, str], str] = {}
        #: (tenant, subject key version) -> when its row was last seen live (``reader``)
        self._subject_checked: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def _unwrap(self, row: DataKeyRow) -> AESGCM:
        """The cipher of ``row``'s key. A subject's key is derived from its
        unwrapped half and its secret in the keyring's shredder
        (``cairn.security.shredding``): ``KeyErased`` if either is destroyed."""
        if row.erased:
            raise KeyErased(f"data key {row.version} of tenant {row.tenant!r} was erased (crypto-shredded)")
        try:
            key = self.keyring.unwrap(row.kek_id, row.wrapped, context(row.tenant, row.version))
        except SealError as exc:
            raise SealError(f"data key {row.version} of tenant {row.tenant!r}: {exc}") from None
        if row.subject is not None:
            name = secret_name(row.tenant, row.version)
            secret = shredder_of(self.keyring).secret(name, create=False)
            if secret is None:
                raise KeyErased(f"data key {row.version} of tenant {row.tenant!r} was erased "
                                "(crypto-shredded: "
                                "its subject secret is gone)")
            key = hmac.new(secret, b"cairn subject data key\x00" + key, hashlib.sha256).digest()
        self._keys[(row.tenant, row.version)] = key
        return aesgcm(key)

    def subkey(self, tenant: str, *purpose: bytes, version: int = 1) -> bytes:
        """A key of ``tenant`` for one purpose, never the data key itself:
        HMAC-SHA-256 of the data key ``version`` with each label of
        ``purpose`` in turn (``k = HMAC(k, label)``), cached per process.
        The one derivation of every per-tenant key: the synthetic-nonce key
        of artifacts (``NONCE_PURPOSE``), the audit digest key
        (``store.auditkeys``), the workspace object address key
        (``store.wssealed``, a path of two labels: its addresses were
        derived that way when stored, so they keep their values). Derived
        from version 1 unless told (a tenant's first key, which rotation
        never removes: one value per tenant for good); ``SealError`` if
        that version is not stored."""
        known = self._subkeys.get((tenant, version, purpose))
        if known is not None:
            return known
        key = self._keys.get((tenant, version))
        if key is None:
            with self._lock:
                self._load(tenant)
            key = self._keys.get((tenant, version))
            if key is None:
                raise SealError(f"data key {version} of tenant {tenant!r} is not stored")
        for label in purpose:
            key = hmac.new(key, label, hashlib.sha256).digest()
        self._subkeys[(tenant, version, purpose)] = key
        return key

    def nonce_key(self, tenant: str, version: int) -> bytes:
        """The synthetic-nonce key of a key ``writer`` or ``reader`` returned."""
        return self.subkey(tenant, NONCE_PURPOSE, version=version)

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
            if row.version >= SUBJECT_KEY_BASE:  # a subject's: unwrapped when first read (``reader``)
                continue
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
            return self._add(tenant)

    def _add(self, tenant: str) -> int:
        """``add``, holding the lock."""
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
        with self._lock:  # the first key made once: two threads sealing a tenant's first values made two
            version = self._load(tenant)
            if version == 0:
                version = self._add(tenant)
        return version, self._ciphers[(tenant, version)]

    def writing_key(self, tenant: str) -> tuple[int, AESGCM, bytes, float]:
        """``writer``'s key with its envelope header (uncompressed) and when
        the stored keys were last read, cached in ``writing`` until
        ``KEY_REFRESH_SECONDS`` after that reading."""
        version, cipher = self.writer(tenant)
        checked = self._newest[tenant][2]
        entry = self.writing[tenant] = (version, cipher, header(0, version, tenant), checked)
        return entry

    # -- subject keys (erasure: cairn.api.erasure) ------------------------------------------------

    def subject_digest(self, tenant: str, subject: str) -> str:
        """A keyed digest of ``subject`` (HMAC-SHA-256 under a key derived
        from the tenant's data key 1): what the database stores to find a
        subject's key and record its erasure, never the subject itself, and
        not testable against guessed ids without the keyring. Cached: a
        subject's every value sealed asks for it."""
        known = self._digests.get((tenant, subject))
        if known is not None:
            return known
        self.writer(tenant)  # the tenant's keys exist and are loaded
        key = self.subkey(tenant, NONCE_PURPOSE, b"cairn subject digest", version=1)
        digest = hmac.new(key, subject.encode(), hashlib.sha256).hexdigest()
        if len(self._digests) >= 65536:  # a worker's lifetime of subjects: start over, never grow
            self._digests.clear()
        self._digests[(tenant, subject)] = digest
        return digest

    def subject_writer(self, tenant: str, subject: str) -> tuple[int, AESGCM]:
        """The live data key of ``subject`` of ``tenant`` (created if none:
        a fresh version above ``SUBJECT_KEY_BASE`` and a fresh secret in the
        keyring's shredder), looked up again every ``KEY_REFRESH_SECONDS``."""
        digest = self.subject_digest(tenant, subject)
        known = self._subjects.get((tenant, digest))
        if known is not None and time.monotonic() - known[2] <= KEY_REFRESH_SECONDS:
            return known[0], known[1]
        shredder = shredder_of(self.keyring)
        with self._lock:
            for attempt in range(64):
                rows = self._store.data_keys(tenant)
                live = next((r for r in rows if r.subject == digest and not r.erased), None)
                if live is None:
                    version = max([SUBJECT_KEY_BASE] + [r.version for r in rows]) + 1 + attempt
                    shredder.secret(secret_name(tenant, version), create=True)
                    kek = self.keyring.current()
                    wrapped = self.keyring.wrap(kek, os.urandom(KEY_SIZE), context(tenant, version))
                    live = self._store.add_subject_key(DataKeyRow(tenant, version, kek, wrapped, time.time(),
                                                                  digest))
                    if live is None:
                        continue  # the version went to another subject meanwhile
                cipher = self._ciphers.get((tenant, live.version))
                if cipher is None:
                    cipher = self._ciphers[(tenant, live.version)] = self._unwrap(live)
                self._subjects[(tenant, digest)] = (live.version, cipher, time.monotonic())
                return live.version, cipher
        raise SealError(f"cannot create a subject key for tenant {tenant!r}: every version tried was taken")

    def shred(self, tenant: str, digest: str | None) -> list[int]:
        """Crypto-shredding: destroy the keys of the subject of ``digest``
        (``None``: of every subject of ``tenant``). Their secrets go first
        (what makes them unrecoverable, from any copy of the database too),
        then their rows become tombstones; re-run after a crash, it destroys
        what is left. The versions whose rows were live until now."""
        rows = [r for r in self._store.data_keys(tenant)
                if r.subject is not None and (digest is None or r.subject == digest)]
        shredder_of(self.keyring).destroy([secret_name(tenant, r.version) for r in rows])
        destroyed: list[int] = self._store.erase_subject_keys(tenant, digest)
        with self._lock:
            for row in rows:
                self._ciphers.pop((tenant, row.version), None)
                self._keys.pop((tenant, row.version), None)
                for derived in [k for k in self._subkeys if k[0] == tenant and k[1] == row.version]:
                    self._subkeys.pop(derived, None)
            for known in [k for k in self._subjects if k[0] == tenant and (digest is None or k[1] == digest)]:
                self._subjects.pop(known, None)
        return destroyed

    def _subject_reader(self, tenant: str, version: int, place: Place) -> AESGCM:
        row = next((r for r in self._store.data_keys(tenant) if r.version == version), None)
        if row is None:
            raise SealError(f"{place} was sealed with data key {version} of tenant {tenant!r}, "
                            "which is not stored: refused")
        try:
            cipher = self._unwrap(row)
        except KeyErased:
            with self._lock:
                self._ciphers.pop((tenant, version), None)
            raise KeyErased(f"{place} was sealed with the data key of a subject that was erased "
                            f"(data key {version}, crypto-shredded): it can never be read") from None
        with self._lock:
            self._ciphers[(tenant, version)] = cipher
            self._subject_checked[(tenant, version)] = time.monotonic()
        return cipher

    def reader(self, tenant: str, version: int, place: Place) -> AESGCM:
        cipher = self._ciphers.get((tenant, version))
        if version >= SUBJECT_KEY_BASE and (cipher is None or time.monotonic() - self._subject_checked.get(
                (tenant, version), 0.0) > KEY_REFRESH_SECONDS):
            # a subject's key erased by another process stops opening here within KEY_REFRESH_SECONDS
            return self._subject_reader(tenant, version, place)
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

    def __init__(self, keys: DataKeys, subject_of: Callable[[str], str | None] = lambda run: None,
                 subjects: dict[str, str | None] | None = None) -> None:
        self.keys = keys
        #: the subject of a run (``None``: none), whose key seals the values stored at its places
        self.subject_of = subject_of
        #: ``subject_of``'s own cache if it has one (run -> subject), looked up first by ``seal_at``:
        #: a dictionary lookup instead of a Python call per value sealed
        self._subjects: dict[str, str | None] = {} if subjects is None else subjects
        #: the keys' own cache of writing keys (``DataKeys.writing``), shared
        self._writing = keys.writing
        #: artifact ref -> the tenant whose run named it when last read: a ref
        #: copied into another tenant's row is opened as that tenant's, and refused
        self.artifact_tenants: OrderedDict[str, str] = OrderedDict()

    def writer(self, tenant: str, run: str, subject: str | None = None) -> tuple[int, AESGCM]:
        """The key that seals a value of ``run`` (``"-"``: of no run) of
        ``tenant``: the data key of ``subject``, else of the run's subject,
        else the tenant's."""
        if subject is None and run != "-":
            subject = self.subject_of(run)
        if subject is not None:
            return self.keys.subject_writer(tenant, subject)
        return self.keys.writer(tenant)

    def seal(self, place: Place, data: bytes, subject: str | None = None) -> bytes:
        version, cipher = self.writer(place.tenant, place.run, subject)
        return seal(cipher, version, place, data)

    def seal_at(self, tenant: str, run: str, table: str, position: str, kind: str, data: bytes) -> bytes:
        """``seal(Place(tenant, run, table, position, kind), data)`` in one call
        for what a run stores most (its input and result; a step's entry
        takes ``cairn.store.sealedsteps``): the same envelope, bound to the
        same place, sealed with the tenant's writing key as ``DataKeys.writing``
        caches it, without building a ``Place`` or going through ``writer``
        and ``envelope.seal``. A value of ``COMPRESS_AT`` bytes or more is
        compressed here too (``envelope.compress``), as ``envelope.seal``
        would: until 2026-12-07 (issue 25) it took that longer way, and
        ``zlib.compress``'s 256 KB of state. Each Python call is about a
        microsecond of a journaled step, as much as the AES-GCM of a
        kilobyte; ``bench/encryption.py`` measures it."""
        if run != "-":
            subject = self._subjects.get(run, _UNKNOWN)
            if subject is not None and (subject is not _UNKNOWN or self.subject_of(run) is not None):
                return self.seal(Place(tenant, run, table, position, kind), data)  # the subject's key
        known = self._writing.get(tenant)
        if known is None or time.monotonic() - known[3] > KEY_REFRESH_SECONDS:
            known = self.keys.writing_key(tenant)
        head = known[2]
        if len(data) >= COMPRESS_AT:
            packed = compress(data)
            if len(packed) < len(data):
                data, head = packed, header(FLAG_ZLIB, known[0], tenant)
        try:
            nonce = take_nonce()
        except IndexError:
            nonce = fresh_nonce()
        return b"".join((head, nonce, known[1].encrypt(
            nonce, data, head + encode_place((tenant, run, table, position, kind)))))

    def open(self, place: Place, data: bytes) -> bytes:
        """The plaintext of ``data`` stored at ``place``; ``SealError`` if it
        is not an envelope that opens there. A value that is no envelope is
        refused (no plaintext fallback), unless an existing database is being
        sealed (``cairn keys adopt``) and it was written before: that is
        asked only once the header is found wrong, not of every value."""
        try:
            version = key_version(data, place)
        except SealError:
            if not is_envelope(data) and self.keys.adopting():
                return data  # written before encryption was turned on, not sealed yet
            raise
        return open_sealed(self.keys.reader(place.tenant, version, place), place, data)

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
                  plain: frozenset[str] = PLAIN_DETAIL, subject: str | None = None) -> dict[str, Any] | None:
        if value is None:
            return None
        kept = {k: v for k, v in value.items() if k in plain}
        rest = {k: v for k, v in value.items() if k not in plain}
        if rest:
            kept["sealed"] = base64.b64encode(self.seal(place, _ENCODE.encode(rest), subject)).decode()
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


class KeyedAddresses:
    """What a sealed store keeps at keyed addresses (artifacts:
    ``store.sealedartifacts``; workspace objects: ``store.wssealed``) over
    ``inner``, the store under it. An address must survive re-encryption, so
    each tenant's address key is derived from its data key 1 (never removed
    by a rotation) through the synthetic-nonce key, ``HMAC(HMAC(data key 1,
    NONCE_PURPOSE), address_context)``: the derivation the stored addresses
    were made with, kept so they stay valid. One derivation for both kinds;
    each names its own ``address_context``, so their keys differ."""

    #: what the address key is derived for (each kind of object its own)
    address_context: ClassVar[bytes]

    def __init__(self, inner: Any, keys: DataKeys, sealer: Sealer) -> None:
        self.inner, self.keys, self.sealer = inner, keys, sealer
        self._address_keys: dict[str, bytes] = {}

    def address_key(self, tenant: str) -> bytes:
        """``tenant``'s address key (derived once, then cached: it never changes)."""
        key = self._address_keys.get(tenant)
        if key is None:
            self.keys.writer(tenant)  # the tenant's first data key, created if it has none
            key = self._address_keys[tenant] = self.keys.subkey(
                tenant, NONCE_PURPOSE, self.address_context, version=ADDRESS_KEY_VERSION)
        return key
