"""The rows of erasure (issue 26, ``cairn.api.erasure``) in the SQL stores.

Rows only: which runs an erasure covers, the memory a subject owns, and the
erasure records. A record holds no personal data: the scope, a digest of
what was erased (keyed under encryption: ``SealedStore.subject_digest``),
the counts, the times and the actor. Runs are deleted by ``prune_runs`` (the
one run-deletion path), keys destroyed by ``SealedStore.shred``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from cairn.store.oplog import OperatorAction, auth_of
from cairn.store.oplogsql import record_in
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")

#: what an erasure covers
SCOPES = ("subject", "thread", "tenant")


@dataclass(frozen=True, slots=True)
class ErasureRecord:
    """One erasure: ``finished_at`` is ``None`` while it has not completed
    (interrupted: running it again completes it, ``cairn.api.erasure``)."""

    id: str
    tenant: str
    scope: str
    digest: str
    actor: str
    started_at: float
    finished_at: float | None
    counts: dict[str, int]
    #: keyed digests of the runs it deleted (``api.erasure.run_digest``)
    runs: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "scope": self.scope, "digest": self.digest,
                "actor": self.actor, "started_at": self.started_at, "finished_at": self.finished_at,
                "counts": self.counts}


def _record(row: tuple[Any, ...]) -> ErasureRecord:
    counts = msgspec.json.decode(row[7]) if row[7] else {}
    runs = msgspec.json.decode(row[8]) if row[8] else []
    return ErasureRecord(str(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), float(row[5]),
                         None if row[6] is None else float(row[6]), dict(counts), frozenset(runs))


def plain_digest(tenant: str, scope: str, target: str) -> str:
    """The digest of an erasure's target without encryption (SHA-256: the
    database holds everything in the clear anyway, so a key adds nothing)."""
    return hashlib.sha256(f"cairn erasure\x00{tenant}\x00{scope}\x00{target}".encode()).hexdigest()


class SQLErasure(SQLPrimitives[Tx]):
    """Erasure's rows over a dialect's primitives (declared here, defined by the store)."""

    def run_subject(self, run_id: str) -> str | None:
        """The subject run ``run_id`` was started for (``None``: none, or no such run)."""
        rows = self._select("select_run_subject", {"run_id": run_id})
        return None if not rows or rows[0][0] is None else str(rows[0][0])

    def subject_digest(self, tenant: str, subject: str) -> str:
        """What an erasure record stores for ``subject`` (see ``plain_digest``)."""
        return plain_digest(tenant, "subject", subject)

    def shred(self, tenant: str, digest: str | None) -> list[int]:
        """No keys to destroy without encryption (``SealedStore.shred`` destroys them)."""
        return []

    def erasure_runs(self, tenant: str, subject: str | None, thread_id: str | None
                     ) -> list[tuple[str, str, str | None]]:
        """``(run_id, status, parent_run_id)`` of ``tenant``'s runs of
        ``subject``, of ``thread_id``, or (both ``None``) all of them."""
        rows = self._select("erasure_runs", {"tenant": tenant, "subject": subject, "thread_id": thread_id})
        return [(str(r[0]), str(r[1]), None if r[2] is None else str(r[2])) for r in rows]

    def start_erasure(self, record: ErasureRecord) -> None:
        """Insert the record and, in the same transaction, its tenant's
        operator log record (``erasure.start``: the scope and the target's
        digest, no personal data; who)."""

        def body(tx: Tx) -> None:
            self._query(tx, "insert_erasure", {
                "id": record.id, "tenant": record.tenant, "scope": record.scope, "digest": record.digest,
                "actor": record.actor, "now": record.started_at})
            record_in(self, tx, OperatorAction(record.tenant, "erasure", record.id, "erasure.start",
                                               record.actor, auth_of(record.actor),
                                               {"scope": record.scope, "target": record.digest}))

        self._operate(body)

    def finish_erasure(self, erasure_id: str, counts: Mapping[str, int], actor: str, *, tenant: str) -> None:
        """Mark erasure ``erasure_id`` of ``tenant`` finished with its counts,
        and record ``erasure.finish`` in the tenant's operator log, in one
        transaction."""

        def body(tx: Tx) -> None:
            self._query(tx, "finish_erasure", {
                "id": erasure_id, "counts": msgspec.json.encode(dict(counts)).decode(), "actor": actor,
                "now": self.clock()})
            record_in(self, tx, OperatorAction(tenant, "erasure", erasure_id, "erasure.finish", actor,
                                               auth_of(actor), {"counts": dict(counts)}))

        self._operate(body)

    def note_erased_runs(self, erasure_id: str, digests: Collection[str]) -> None:
        """Record the keyed digests of the runs erasure ``erasure_id``
        deletes (before it deletes them: a resumed erasure adds to them)."""
        self._operate(lambda tx: self._query(tx, "note_erasure_runs", {
            "id": erasure_id, "runs": msgspec.json.encode(sorted(digests)).decode()}))

    def erased_runs(self, tenant: str | None = None) -> dict[str, set[str]]:
        """tenant -> the keyed digests of the runs its erasures deleted."""
        found: dict[str, set[str]] = {}
        for owner, runs in self._select("select_erasure_runs", {"tenant": tenant}):
            found.setdefault(str(owner), set()).update(msgspec.json.decode(runs))
        return found

    def erasures(self, tenant: str | None = None, *, unfinished: tuple[str, str] | None = None,
                 limit: int = 100) -> list[ErasureRecord]:
        """The erasure records, newest first (of ``tenant``; only the
        unfinished ones of ``unfinished`` = (scope, digest))."""
        scope, digest = unfinished if unfinished is not None else (None, None)
        rows = self._select("select_erasures", {"tenant": tenant, "scope": scope, "digest": digest,
                                                "limit": limit})
        return [_record(row) for row in rows]
