"""The audit chain's reads and checkpoint rows in the SQL stores (issue 26;
the links themselves are written with the entries: ``store.auditlinks``).

Reads come a page at a time in ``(run_id, seq)`` order, rows as stored
(``ENTRY_COLUMNS``): the verifier (``store.auditverify``) recomputes every
link from them and never trusts a decoded copy.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from cairn.store import logmerge
from cairn.store.auditlinks import PENDING
from cairn.store.auditverify import recomputed_digest
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")

#: The columns of an ``audit_entries`` row, in order.
ENTRY_COLUMNS = ("run_id", "seq", "event", "at", "epoch", "worker", "position", "step_kind", "name",
                 "input_hash", "attempt", "started_at", "payload", "payload_ref", "detail", "digest", "link",
                 "tenant")

#: The columns of an audit log row (``audit_log_rows``), in order.
LOG_COLUMNS = ("run_id", "seq", "event", "at", "epoch", "worker", "detail", "tenant")

#: Rows read per page.
PAGE = 2000

_INF = float("inf")
#: above every seq
_SEQ_MAX = 1 << 62
#: hot runs read per page of a tenant's runs, oldest first
RUNS_PAGE = 64


def _log_key(row: tuple[Any, ...]) -> tuple[float, str, int]:
    """A ``LOG_COLUMNS`` row's place in the log: ``(at, run_id, seq)``."""
    return (float(row[3]), str(row[0]), int(row[1]))


def _log_at(row: tuple[Any, ...]) -> float:
    return float(row[3])


class SQLAudit(SQLPrimitives[Tx]):
    """Audit reads and checkpoint rows over a dialect's primitives."""

    def audit_entries(self, *, tenant: str | None = None, run_id: str | None = None,
                      page: int = PAGE) -> Iterator[tuple[Any, ...]]:
        """Every history row (``ENTRY_COLUMNS``) of ``tenant``, of
        ``run_id`` or of all, in ``(run_id, seq)`` order, a page at a time
        (the pages flattened by ``itertools.chain``, not a Python generator
        resumed per row: the verifier reads hundreds of thousands a second)."""
        return itertools.chain.from_iterable(self._audit_pages(tenant, run_id, page))

    def _audit_pages(self, tenant: str | None, run_id: str | None,
                     page: int) -> Iterator[list[tuple[Any, ...]]]:
        after_run, after_seq = "", 0
        while True:
            rows = self._audit_page({"tenant": tenant, "run_id": run_id, "after_run": after_run,
                                     "after_seq": after_seq, "page": page})
            yield rows
            if len(rows) < page:
                return
            after_run, after_seq = rows[-1][0], int(rows[-1][1])

    def _audit_page(self, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """One page of ``audit_entries`` (PostgreSQL pins its plan to the primary key)."""
        return self._select("audit_entries", params)

    def _store_audit_digest(self, tx: Tx, run_id: str, seq: int) -> None:
        """Store the digest of entry ``seq`` of ``run_id`` if it was written
        without one (no keyring: the verifier recomputes it from the body),
        in ``tx``, before the caller removes or seals that body: after, the
        digest could not be recomputed and the entry could not be linked.
        A body that already cannot give it (damaged) is left as found: the
        verifier reports it. The entry is read as the verifier reads it
        (``audit_entries``, a page of one from just before it)."""
        rows = self._query(tx, "audit_entries", {"tenant": None, "run_id": run_id, "after_run": run_id,
                                                 "after_seq": seq - 1, "page": 1})
        row = rows[0] if rows and int(rows[0][1]) == seq else None
        if row is None or row[15] is not None or row[16] is None or bytes(row[16]) == PENDING:
            return  # gone, its digest stored, or not linked (yet): nothing to keep
        found = recomputed_digest(row)
        if found is not None:
            self._query(tx, "audit_store_digest", {"run_id": run_id, "seq": seq, "digest": found})

    def store_audit_digest(self, run_id: str, seq: int) -> None:
        """``_store_audit_digest`` in a transaction of its own (``store.rekey``)."""
        self._operate(lambda tx: self._store_audit_digest(tx, run_id, seq))

    def audit_log_rows(self, *, tenant: str | None = None, run_id: str | None = None,
                       since: float | None = None, after: tuple[float, str, int] | None = None,
                       newest: bool = False, page: int = PAGE) -> Iterator[tuple[Any, ...]]:
        """The hot entries as the audit log shows them (``LOG_COLUMNS``), in
        ``(at, run_id, seq)`` order (reversed if ``newest``), past the
        position ``after`` in that order, since ``since``; read as the
        caller goes on, so a log's page reads about what it shows.

        No index orders ``history`` by time (one would cost every journaled
        step its insert: bench/results/auditpage-2026-12-06.txt). A run's
        entries are in time order by ``seq`` (each is clamped to the one
        before) and none is before the run's creation (its first entry is
        written at ``created_at``): so a tenant's entries are its hot runs'
        merged (``logmerge``), each run read by its primary key and opened
        only once the merge reaches where it starts: its ``created_at``
        oldest first (``runs_tenant_created``), its last entry's time newest
        first. Every tenant's (no tenant, no run) merge one stream per tenant."""
        position = after if after is not None else ((_INF, "", 0) if newest else (-_INF, "", 0))
        floor = -_INF if since is None else float(since)
        if not newest and since is not None:  # oldest first, the floor is the lower bound of the reads
            position = max(position, (floor, "", -1))  # below every entry at the floor: run ids are not empty
        if run_id is not None:
            return self._run_log_rows(run_id, tenant, position, floor, newest, page)
        tenants = [tenant] if tenant is not None else \
            [str(t) for (t,) in self._select("audit_log_tenants", {})]
        streams = [logmerge.lazy_merge(self._hot_runs(t, position, floor, newest, page), _log_key, _log_at,
                                       newest=newest) for t in tenants]
        return streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_log_key, reverse=newest)

    def _hot_runs(self, tenant: str, position: tuple[float, str, int], floor: float, newest: bool,
                  page: int) -> Iterator[tuple[float, Callable[[], Iterator[tuple[Any, ...]]]]]:
        """The tenant's hot runs that may have entries past ``position``, in
        the order their entries start in the log's direction, each with its
        start and how to read its entries (``logmerge``'s sources)."""
        def opener(run: str) -> Callable[[], Iterator[tuple[Any, ...]]]:
            return lambda: self._run_log_rows(run, None, position, floor, newest, page)

        if newest:  # every hot run created by then, by its last entry's time (one statement)
            rows = self._select("audit_log_runs_newest", {"tenant": tenant, "at": position[0]})
            for last, run in sorted(((float(at), str(r)) for r, at in rows if at is not None and at >= floor),
                                    reverse=True):
                yield last, opener(run)
            return
        after_created, after_run = -_INF, ""
        while True:  # the runs created after the position, and those before it with an entry after it
            rows = self._select("audit_log_runs_oldest", {"tenant": tenant, "at": position[0],
                                                          "after_created": after_created,
                                                          "after_run": after_run, "page": RUNS_PAGE})
            for run, created in rows:
                yield float(created), opener(str(run))
            if len(rows) < RUNS_PAGE:
                return
            after_created, after_run = float(rows[-1][1]), str(rows[-1][0])

    def _run_log_rows(self, run_id: str, tenant: str | None, position: tuple[float, str, int], floor: float,
                      newest: bool, page: int) -> Iterator[tuple[Any, ...]]:
        """One run's entries past ``position``, by ``seq`` (its time order), a page at a time."""
        name = "audit_log_run_newest" if newest else "audit_log_run_oldest"
        at, after_run, after_seq = position
        bound = _SEQ_MAX if newest else 0
        while True:
            rows = self._select(name, {"tenant": tenant, "run_id": run_id, "since": floor, "at": at,
                                       "after_run": after_run, "after_seq": after_seq, "seq": bound,
                                       "page": page})
            yield from rows
            if len(rows) < page:
                return
            bound = int(rows[-1][1])

    def audit_run_tenants(self, *, tenant: str | None = None, run_id: str | None = None) -> dict[str, str]:
        """run -> tenant of the runs in scope (the run rows, to check each entry's tenant against)."""
        rows = self._select("audit_run_tenants", {"tenant": tenant, "run_id": run_id})
        return {str(r): str(t) for r, t in rows}

    def audit_legacy(self) -> dict[str, int]:
        """run -> the last entry it had before the audit chain existed (migration 0022 / 0031)."""
        return {str(r): int(s) for r, s in self._select("audit_legacy", {})}

    def save_audit_checkpoint(self, tenant: str, at: float, record: str) -> int:
        """Keep a signed checkpoint record (JSON); its id (per tenant, from 1)."""
        rows = self._operate(lambda tx: self._query(tx, "insert_audit_checkpoint",
                                                    {"tenant": tenant, "at": at, "record": record}))
        return int(rows[0][0])

    def audit_checkpoints(self, tenant: str | None = None) -> list[tuple[str, int, float, str]]:
        """The checkpoints kept: ``(tenant, id, at, record)``."""
        return [(str(t), int(i), float(a), str(r)) for t, i, a, r in
                self._select("audit_checkpoints", {"tenant": tenant})]
