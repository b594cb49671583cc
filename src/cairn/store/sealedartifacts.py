"""Artifacts under encryption at rest: sealed at an address that survives re-encryption.

An artifact used to be stored under the SHA-256 of its sealed bytes. Those
bytes change when a rotation re-encrypts it, so its name would change too,
and every row naming it would have to follow: ``history.payload_ref`` among
them, which the audit chain's links cover (``store.auditlinks``), so moving
it would break ``cairn audit verify``. So a sealed store names an artifact
by an *address* that depends on its content and its tenant only:

    address = HMAC-SHA-256(address key of the tenant, plaintext)   (hex)
    address key = HMAC-SHA-256(nonce key of the tenant's data key 1, "cairn artifact address")

(as workspace objects are, ``store.wssealed``). Data key 1 is never removed
by a rotation, so one content keeps one address across rotations: one
tenant's equal content is one artifact, another tenant's is another
address (nothing shared, nothing learnt across tenants). The bytes are
sealed for the place ``(tenant, "-", "artifacts", address, "data")``, so a
re-encryption rewrites them in place (``replace_artifact``, compare-and-set)
and no row, link or digest changes; bytes moved under another name do not
open there (another artifact's, or another tenant's).

Artifacts stored before addresses keep their old name (the hash of their
sealed bytes) until a pass re-encrypts them: that is how they are told
apart, their bytes hash to their name, and they open at the old place
``(tenant, "-", "artifacts", "-", "data")``. Re-encrypted, they are sealed
at their name like the others, and their name stops being a hash of them.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

from cairn.security.envelope import Place, seal, synthetic_nonce
from cairn.store.sealing import KeyedAddresses

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: the table of an artifact's place
TABLE = "artifacts"
#: what the address key is derived for, from the tenant's first data key
ADDRESS_CONTEXT = b"cairn artifact address"


def place_of(tenant: str, address: str) -> Place:
    """Where an artifact stored at ``address`` is sealed."""
    return Place(tenant, "-", TABLE, address, "data")


def legacy_place(tenant: str) -> Place:
    """Where an artifact stored before addresses was sealed (its name: the SHA-256 of its sealed bytes)."""
    return Place(tenant, "-", TABLE, "-", "data")


def is_legacy(ref: str, stored: bytes) -> bool:
    """Whether ``stored`` is an artifact sealed before addresses: its bytes hash to its name."""
    return hmac.compare_digest(hashlib.sha256(stored).hexdigest(), ref)


class SealedArtifacts(KeyedAddresses):
    """A sealed store's artifacts: stored at their tenant's addresses, opened, re-sealed."""

    address_context = ADDRESS_CONTEXT

    def address(self, tenant: str, data: bytes, scope: str = "") -> str:
        """``data``'s address among ``tenant``'s artifacts, or among those of
        ``scope`` (a subject's keyed digest) under a key of the scope's own:
        one subject's artifact never shares an object, so a key, with
        another's or with the tenant's (erasing the subject destroys its
        artifacts and nobody else's)."""
        key = self.address_key(tenant)
        if scope:
            key = hmac.new(key, b"cairn subject artifacts\x00" + scope.encode(), hashlib.sha256).digest()
        return hmac.new(key, data, hashlib.sha256).hexdigest()

    def sealed(self, tenant: str, address: str, data: bytes,
               writer: tuple[int, AESGCM] | None = None) -> bytes:
        """``data`` sealed at ``address`` with ``writer`` (the tenant's newest
        key unless told) and a synthetic nonce: the same content under the
        same key is the same bytes, so concurrent writers of one artifact
        write one value."""
        version, cipher = writer if writer is not None else self.keys.writer(tenant)
        place = place_of(tenant, address)
        nonce = synthetic_nonce(self.keys.nonce_key(tenant, version), place, data)
        return seal(cipher, version, place, data, nonce)

    def put(self, tenant: str, data: bytes, writer: tuple[int, AESGCM] | None = None, scope: str = "") -> str:
        """Store ``data`` as one of ``tenant``'s artifacts (sealed with
        ``writer``, at an address within ``scope``: a subject's); its address."""
        address = self.address(tenant, data, scope)
        self.inner.put_artifact_at(address, self.sealed(tenant, address, data, writer))
        return address

    def open(self, tenant: str, ref: str, stored: bytes) -> bytes:
        """The plaintext of artifact ``ref`` of ``tenant`` stored as ``stored``;
        ``SealError`` naming its place if it does not open there."""
        place = legacy_place(tenant) if is_legacy(ref, stored) else place_of(tenant, ref)
        return self.sealer.open(place, stored)

    def resealed(self, tenant: str, ref: str, stored: bytes) -> bytes:
        """Artifact ``ref``'s bytes sealed again at its name with the tenant's newest key."""
        return self.sealed(tenant, ref, self.open(tenant, ref, stored))


__all__ = ["ADDRESS_CONTEXT", "SealedArtifacts", "is_legacy", "legacy_place", "place_of"]
