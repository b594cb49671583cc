"""The data keys of encryption at rest, in the SQL stores (migration ``data_keys``).

Rows only: a data key is stored wrapped by a key-encryption key and this
module never sees a key in the clear (``cairn.store.sealed`` unwraps them
with the keyring). Adding a version is insert-if-absent, so two workers that
seal a tenant's first value at once agree on one key (the loser reads the
winner's). Rewrapping (a KEK rotation) is compare-and-set on the KEK id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")


@dataclass(frozen=True, slots=True)
class DataKeyRow:
    """A tenant's data key of ``version``, wrapped by KEK ``kek_id``; with
    ``subject`` (a keyed digest), one subject's key (``SUBJECT_KEY_BASE``)."""

    tenant: str
    version: int
    kek_id: str
    wrapped: bytes
    created_at: float
    subject: str | None = None

    @property
    def erased(self) -> bool:
        """Whether this is the tombstone of a destroyed subject key."""
        return self.kek_id == ERASED_KEK


#: subject keys take versions above this one (a tenant's own versions stay below)
SUBJECT_KEY_BASE = 1 << 30
#: the ``kek_id`` of a destroyed subject key's tombstone (its version is never reused)
ERASED_KEK = "erased"


def _row(row: tuple[Any, ...]) -> DataKeyRow:
    return DataKeyRow(str(row[0]), int(row[1]), str(row[2]), bytes(row[3]), float(row[4]),
                      None if row[5] is None else str(row[5]))


class SQLKeys(SQLPrimitives[Tx]):
    """``data_keys`` over a dialect's primitives (declared here, defined by the store)."""

    # -- re-encryption (cairn.store.rekey): pages of sealed columns, compare-and-set writes --------

    def rekey_page(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """A page of sealed columns: the ``rekey_*_page`` query ``name``."""
        if not (name.startswith("rekey_") and name.endswith("_page")):
            raise ValueError(f"not a re-encryption page: {name!r}")
        return self._select(name, params)

    def rekey_set(self, name: str, params: Mapping[str, Any]) -> bool:
        """Write new envelopes if the row still holds the old ones (the
        ``rekey_*_set`` statement ``name``); whether it did. Durable like an
        operator's action: a re-encryption pass is one."""
        if not (name.startswith("rekey_") and name.endswith("_set")):
            raise ValueError(f"not a re-encryption write: {name!r}")
        return self._operate(lambda tx: self._changed(tx, name, params)) == 1

    def data_keys(self, tenant: str | None = None) -> list[DataKeyRow]:
        """Every stored data key (of ``tenant``), by tenant then version."""
        return [_row(row) for row in self._select("select_data_keys", {"tenant": tenant})]

    def add_data_key(self, row: DataKeyRow) -> DataKeyRow:
        """Store ``row`` unless the tenant has that version already; the row
        stored at that version either way."""

        def body(tx: Tx) -> DataKeyRow:
            self._query(tx, "insert_data_key", {
                "tenant": row.tenant, "version": row.version, "kek_id": row.kek_id, "wrapped": row.wrapped,
                "created_at": row.created_at})
            for found in self._query(tx, "select_data_keys", {"tenant": row.tenant}):
                if int(found[1]) == row.version:
                    stored = _row(found)
                    if stored.kek_id == row.kek_id and stored.created_at == row.created_at:
                        # ours (not a concurrent rotation's): the operator log's record, if acting
                        # (store.oplogsql); the version and KEK id only, never the key
                        log = getattr(self, "_log_action", None)
                        if log is not None:
                            log(tx, version=row.version, kek_id=row.kek_id)
                    return stored
            raise AssertionError("a data key inserted is not read back")

        return self._operate(body)

    def add_subject_key(self, row: DataKeyRow) -> DataKeyRow | None:
        """Store subject key ``row`` unless its version is taken or its
        subject has a live key; the subject's live key after that (``None``:
        the version was another subject's, try the next)."""

        def body(tx: Tx) -> DataKeyRow | None:
            self._query(tx, "insert_subject_key", {
                "tenant": row.tenant, "version": row.version, "kek_id": row.kek_id, "wrapped": row.wrapped,
                "created_at": row.created_at, "subject": row.subject})
            for found in self._query(tx, "select_data_keys", {"tenant": row.tenant}):
                key = _row(found)
                if key.subject == row.subject and not key.erased:
                    return key
            return None

        return self._operate(body)

    def erase_subject_keys(self, tenant: str, subject: str | None) -> list[int]:
        """Destroy the data keys of ``subject`` (a keyed digest; ``None``:
        of every subject of ``tenant``): their rows become tombstones. The
        versions destroyed."""
        name, params = (("erase_tenant_subject_keys", {"tenant": tenant}) if subject is None else
                        ("erase_subject_keys", {"tenant": tenant, "subject": subject}))
        return [int(row[0]) for row in self._operate(lambda tx: self._query(tx, name, params))]

    def delete_data_key(self, tenant: str, version: int) -> bool:
        """Remove one stored key (the adoption marker; crypto-shredding is issue 26's)."""
        return self._operate(lambda tx: self._changed(tx, "delete_data_key",
                                                      {"tenant": tenant, "version": version})) == 1

    def rewrap_data_key(self, row: DataKeyRow, old_kek_id: str) -> bool:
        """Replace the wrapping of ``row``'s key if still wrapped by ``old_kek_id``."""

        def body(tx: Tx) -> bool:
            if self._changed(tx, "rewrap_data_key", {
                    "tenant": row.tenant, "version": row.version, "kek_id": row.kek_id,
                    "wrapped": row.wrapped, "old_kek_id": old_kek_id}):
                # the operator log's record in the rewrapped key's tenant's log, if acting (the KEK
                # ids and the version, never the key); a row another rewrap took first: none
                log = getattr(self, "_log_action", None)
                if log is not None:
                    log(tx, object_id=row.tenant, tenant=row.tenant, version=row.version, kek_id=row.kek_id,
                        old_kek_id=old_kek_id)
            return any(int(r[1]) == row.version and r[2] == row.kek_id
                       for r in self._query(tx, "select_data_keys", {"tenant": row.tenant}))

        return self._operate(body)
