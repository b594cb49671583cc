"""The dialect primitives every SQL mixin is written over, declared once.

Each mixin of ``sqlbase.SQLStore`` (``auditsql.SQLAudit``,
``keysql.SQLKeys``, ``retentionsql.SQLRetention``, ...) reads and writes
through the same few primitives: run a durable write (``_operate``), a
statement in a transaction (``_query``, ``_changed``), a read outside one
(``_select``) or several from one snapshot (``_in_read``), a list as a
parameter (``_list_param``), and the store's clock. They derive from
``SQLPrimitives`` so the type checker knows the primitives without each
mixin restating them; ``SQLStore`` defines ``_operate`` and the dialects
(``SQLiteStore``, ``PostgresStore``) the rest.

Declared, not defined: every body raises, and ``SQLPrimitives`` stands
after all the mixins in a store's method resolution order, so it never
hides a definition a mixin or dialect makes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Generic, TypeVar

Tx = TypeVar("Tx")
T = TypeVar("T")


class SQLPrimitives(Generic[Tx]):
    """What a SQL dialect supplies to the mixins; ``Tx`` is its transaction handle."""

    #: the store's clock (on PostgreSQL by default the server's: ``postgres.DatabaseClock``)
    clock: Callable[[], float]

    def _operate(self, body: Callable[[Tx], T]) -> T:
        """Run ``body`` in one write transaction that commits durably (an
        operator's decision survives whatever crashes next)."""
        raise NotImplementedError

    def _query(self, tx: Tx, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run the dialect's query ``name``; its rows (none for a statement
        that returns nothing)."""
        raise NotImplementedError

    def _changed(self, tx: Tx, name: str, params: Mapping[str, Any]) -> int:
        """Run the dialect's statement ``name``; the number of rows it changed."""
        raise NotImplementedError

    def _select(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run the read-only query ``name`` outside any write transaction
        (inspection stores opened read-only answer it too)."""
        raise NotImplementedError

    def _in_read(self, work: Callable[[Tx], T]) -> T:
        """Run ``work`` in one read-only transaction: every statement it runs
        (``_query``) reads the same snapshot, and it takes no write lock
        (inspection stores opened read-only answer it too)."""
        raise NotImplementedError

    def _list_param(self, items: Collection[str] | Collection[int]) -> Any:
        """A list of strings or integers as the dialect's statements take one
        (SQLite: JSON text for ``json_each``; PostgreSQL: an array)."""
        raise NotImplementedError


__all__ = ["SQLPrimitives"]
