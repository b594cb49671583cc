"""The audit chain's reads and its checkpoints, once for both SQL dialects
(issue 26; the links themselves are written by the database, see
``store.auditlinks``).

Reads come a page at a time in ``(run_id, seq)`` order, entries and links
apart: a verifier merges the two streams, so an entry without its link, a
link without its entry and a gap in either are all seen (a join would hide
one side). Nothing here decodes a row: what is checked is what is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

Tx = TypeVar("Tx")
T = TypeVar("T")

#: Rows per statement when streaming entries or links.
AUDIT_PAGE = 5000


class SQLAudit(Generic[Tx]):
    """The audit methods of the SQL stores over a dialect's primitives."""

    # -- dialect primitives (sqlbase.SQLStore and the dialects provide them) ------------

    def _operate(self, body: Callable[[Tx], T]) -> T:
        raise NotImplementedError

    def _query(self, tx: Tx, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _select(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _in_read(self, work: Callable[[Tx], T]) -> T:
        raise NotImplementedError

    # -- reads ----------------------------------------------------------------------------

    def audit_scan(self, consume: Callable[[Iterator[tuple[Any, ...]], Iterator[tuple[Any, ...]],
                                             Callable[[str], bool]], T],
                   tenant: str | None = None, run_id: str | None = None) -> T:
        """``consume(entries, links, has_links)`` inside one read snapshot
        (a verification never sees an entry committed without its link, or
        half of a write): every history entry as stored
        (``auditlinks.AUDIT_COLUMNS``, the payload as packed, never
        decoded), ``(run_id, seq, tenant, link)`` of every link, both of one
        run or tenant or of all, in ``(run_id, seq)`` order; ``has_links``
        says whether a run has any link."""

        def work(tx: Tx) -> T:
            def has_links(rid: str) -> bool:
                first = {"run_id": rid, "after_seq": -(2**63), "page": 1}
                return bool(self._query(tx, "audit_links_of_run", first))

            return consume(self._pages(tx, "audit_entries", tenant, run_id),
                           self._pages(tx, "audit_links", tenant, run_id), has_links)

        return self._in_read(work)

    def audit_pruned(self, tenant: str | None = None, run_id: str | None = None) -> list[tuple[Any, ...]]:
        """``(run_id, tenant, seq, link, pruned_at)``: the last link of each pruned run."""
        return self._select("audit_pruned", {"tenant": tenant, "run_id": run_id})

    def _pages(self, tx: Tx, what: str, tenant: str | None, run_id: str | None) -> Iterator[tuple[Any, ...]]:
        after_run, after_seq = "", -(2**63)
        while True:
            if run_id is not None:
                rows = self._query(tx, f"{what}_of_run", {"run_id": run_id, "after_seq": after_seq,
                                                          "page": AUDIT_PAGE})
            else:
                rows = self._query(tx, f"{what}_page", {"after_run": after_run, "after_seq": after_seq,
                                                        "tenant": tenant, "page": AUDIT_PAGE})
            yield from rows
            if len(rows) < AUDIT_PAGE:
                return
            after_run, after_seq = rows[-1][0], rows[-1][1]

    # -- checkpoints ------------------------------------------------------------------------

    def save_audit_checkpoint(self, tenant: str, at: float, record: str) -> int:
        """Keep a signed checkpoint of ``tenant`` (its JSON record); its id."""
        rows = self._operate(lambda tx: self._query(tx, "insert_audit_checkpoint",
                                                    {"tenant": tenant, "at": at, "record": record}))
        return int(rows[0][0])

    def audit_checkpoints(self, tenant: str | None = None) -> list[tuple[str, int, float, str]]:
        """``(tenant, id, at, record)`` of the checkpoints kept, oldest first."""
        rows = self._select("audit_checkpoints", {"tenant": tenant})
        return [(r[0], int(r[1]), float(r[2]), r[3]) for r in rows]
