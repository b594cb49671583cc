"""Workspace objects under encryption at rest (``SealedStore``'s
``put_workspace_objects`` and ``workspace_objects``).

The workspace layer names an object by the hash of its kind and bytes
(``cairn.workspace.objects.object_id``): stored as it is, that id would let
anyone who reads the database confirm a guess of a file's content, and
tell that two tenants hold the same file. So a sealed store keeps each
object at an *address*, a keyed hash of its id with a key of its tenant
(derived from the tenant's first data key, which rotation never removes,
so one content keeps one address across rotations: dedup within a tenant,
nothing in common across tenants), and its stored bytes sealed for the
place ``(tenant, "-", "workspace_objects", address, "object")``.

A row read back opens only at its own address of its own tenant: another
object's row copied there does not decrypt and is refused, naming the
object. The object's kind (blob, chunk list, tree) is bound by the seal
too, through the address: the id hashes the kind byte with the bytes, and
the address is a keyed hash of the id, so a row sealed for a blob does not
open at a tree's address (tests/workspace/test_sealed_objects.py). The kind
is not added to the associated data on its own: the reader does not always
know it (a file's ref is a blob or a chunk list), and it would bind nothing
the address does not; the workspace layer checks again that the opened
bytes hash (kind included) to the id. The objects are already compressed by the
workspace layer, so they are sealed without the envelope's compression.

What remains visible: each object's size (to within its compression) and
when it was last stored.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping

from cairn.errors import UnsafeSnapshot
from cairn.security.envelope import NONCE_SIZE, Place, SealError, encode_place, header
from cairn.store.sealing import KeyedAddresses
from cairn.store.wssql import check_oids

#: the journal detail key of a snapshot's root (``engine.workspace.DETAIL_KEY``; the SQL of
#: ``workspace_plain_roots`` reads the same key): the store does not import the engine
WORKSPACE_KEY = "workspace"
#: the table of a sealed object's place
TABLE = "workspace_objects"
#: what the address key is derived for, from the tenant's first data key
ADDRESS_CONTEXT = b"cairn workspace object address"


def address_of(key: bytes, oid: str) -> str:
    """The stored address (hex) of object ``oid`` under a tenant's address ``key``."""
    return hashlib.blake2b(bytes.fromhex(oid), key=key, digest_size=32).hexdigest()


def place_of(tenant: str, address: str) -> Place:
    return Place(tenant, "-", TABLE, address, "object")


class SealedObjects(KeyedAddresses):
    """A tenant's workspace objects, sealed at keyed addresses in ``inner``."""

    address_context = ADDRESS_CONTEXT

    def put(self, tenant: str, run_id: str, epoch: int, objects: Mapping[str, bytes]) -> None:
        """Seal ``objects`` (id -> stored bytes) for ``tenant`` and store them
        at their addresses by the run's holder write (fenced, as unsealed)."""
        check_oids(objects)
        if not objects:
            return
        key = self.address_key(tenant)
        version, cipher = self.keys.writer(tenant)
        head = header(0, version, tenant)
        sealed: dict[str, bytes] = {}
        for oid, data in objects.items():
            address = address_of(key, oid)
            nonce = os.urandom(NONCE_SIZE)
            sealed[address] = b"".join((head, nonce, cipher.encrypt(
                nonce, data, head + encode_place(place_of(tenant, address)))))
        self.inner.put_workspace_objects(run_id, epoch, sealed)

    def keys_of(self, tenant: str, oids: Collection[str]) -> set[str]:
        """The row keys objects ``oids`` may be stored at: their addresses,
        and their ids (rows stored before encryption was turned on)."""
        key = self.address_key(tenant)
        return {address_of(key, oid) for oid in oids} | set(oids)

    def get(self, tenant: str, oids: Collection[str]) -> dict[str, bytes]:
        """The stored bytes of those of ``oids`` that ``tenant`` has, opened;
        ``UnsafeSnapshot`` naming the object for a row that does not open."""
        check_oids(oids)
        if not oids:
            return {}
        key = self.address_key(tenant)
        by_address = {address_of(key, oid): oid for oid in oids}
        found: dict[str, bytes] = {}
        for address, data in self.inner.workspace_objects(tenant, list(by_address)).items():
            oid = by_address[address]
            try:
                found[oid] = self.sealer.open(place_of(tenant, address), data)
            except SealError as exc:
                raise UnsafeSnapshot(f"workspace object {oid} of tenant {tenant!r} is refused: its row does "
                                     f"not open at its address (another object's bytes, another tenant's, "
                                     f"or damaged): {exc}") from None
        missing = [oid for oid in oids if oid not in found]
        if missing and self.keys.adopting():  # stored before encryption was turned on, at their ids
            found.update(self.inner.workspace_objects(tenant, missing))
        return found


__all__ = ["ADDRESS_CONTEXT", "WORKSPACE_KEY", "SealedObjects", "address_of", "place_of"]
