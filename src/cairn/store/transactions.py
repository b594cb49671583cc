"""The handle a transactional step's body gets: the user's SQL, inside the
transaction that records the step (``Store.transact``).

Why a handle and not the connection: Cairn's own statements (the fence
before the body, the journal entry after it) run in the same transaction,
and the transaction is only atomic if the body cannot end it. So the handle
runs statements and nothing else:

* transaction control is refused (``BEGIN``, ``COMMIT``, ``END``,
  ``ROLLBACK``, ``ABORT``, ``SAVEPOINT``, ``RELEASE``, ``PREPARE``), and so are
  statements that change the session the store's own statements run in
  (``SET``, ``RESET``, ``DISCARD``, ``PRAGMA``, ``ATTACH``, ``DETACH``,
  ``VACUUM``, ``CREATE TEMP``, which could shadow Cairn's tables for the
  rest of the connection's life): ``TransactionMisuse``, before anything is
  sent. Both drivers also refuse several statements in one ``execute``, so
  ``SELECT 1; COMMIT`` cannot pass the check. This is a guard against
  mistakes, not a sandbox, so the store checks the session again after the
  body (``SQLStore._check_session``: a temporary table left behind
  is refused, PostgreSQL's settings are set back); what keeps a tenant out
  of another tenant's rows is PostgreSQL's row-level security, which
  applies to these statements as to the store's.
* a statement that fails dooms the transaction: ``SQLError`` is raised at
  the call, and if the body catches it and returns anyway the transaction is
  rolled back all the same. PostgreSQL aborts a transaction at its first
  failed statement (a ``COMMIT`` then rolls back silently, which would lose
  the user's rows while the step looked recorded); SQLite does not, but one
  rule for both backends is what a portable body can rely on.
* rows are fetched at once (``Result``): a cursor left open past the body
  would outlive the transaction.
* the handle is dead once the body returns: a handle kept and used later
  raises ``TransactionMisuse``.

Placeholders are the driver's (``paramstyle``): SQLite ``?`` and
``:name``; PostgreSQL ``%s`` and ``%(name)s`` (a literal ``%`` is then
``%%``). ``dialect`` tells a body which one it talks to. Rewriting one
style into the other would mean parsing SQL (string literals, comments,
dollar quoting) to find them; a wrong guess there corrupts a statement,
where a documented style is only inconvenient.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cairn.errors import SQLError, StoreError, TransactionMisuse

Params = Sequence[Any] | Mapping[str, Any]


class _Cursor(Protocol):
    @property
    def description(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Result:
    """What a statement returned: every row (tuples), the column names and
    how many rows it changed (``rowcount``; -1 where the driver cannot say)."""

    rows: list[tuple[Any, ...]]
    columns: tuple[str, ...]
    rowcount: int

    def fetchone(self) -> tuple[Any, ...] | None:
        """The first row, or ``None``."""
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return list(self.rows)

    def scalar(self) -> Any:
        """The first column of the first row, or ``None`` when there is no row."""
        return self.rows[0][0] if self.rows and self.rows[0] else None

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


#: The statements a body may not run, by their first keyword (see the module doc).
_REFUSED = frozenset({
    "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "PREPARE",
    "SET", "RESET", "DISCARD", "PRAGMA", "ATTACH", "DETACH", "VACUUM",
})
#: leading whitespace, ``-- line`` and ``/* block */`` comments, and ``(``
_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/|\()*", re.DOTALL)
_WORD = re.compile(r"[A-Za-z_]+")
_TEMP = re.compile(r"\s*(?:--[^\n]*(?:\n|$)|/\*.*?\*/|\s)*(?:GLOBAL\s+|LOCAL\s+)?TEMP(?:ORARY)?\b",
                   re.DOTALL | re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def refusal(sql: str) -> str | None:
    """Why ``sql`` may not run in a transactional step's body (``None``: it
    may). Cached: a body sends the same few statements on every step."""
    start = _LEADING.match(sql)
    rest = sql[start.end() if start else 0:]
    word = _WORD.match(rest)
    if word is None:
        return None
    keyword = word.group(0).upper()
    if keyword in _REFUSED:
        return (f"{keyword} is refused in a transactional step: Cairn commits or rolls back the "
                "transaction with the step's journal record (and the session is the store's)")
    if keyword == "CREATE" and _TEMP.match(rest, word.end()):
        return ("CREATE TEMP is refused in a transactional step: a temporary table outlives the "
                "transaction on the store's connection and could shadow Cairn's own tables")
    return None


class Tx:
    """The user's SQL inside a transactional step's transaction.

    ``execute(sql, params)`` runs one statement and returns its ``Result``;
    ``executemany(sql, seq_of_params)`` runs it once per parameter set and
    returns the total row count. ``dialect`` is ``"sqlite"`` or
    ``"postgres"``; ``paramstyle`` the placeholders it takes (module doc).
    """

    __slots__ = ("_describe", "_driver_errors", "_failure", "_infrastructure", "_many", "_open",
                 "_run", "dialect", "paramstyle")

    def __init__(
        self,
        run: Callable[[str, Params | None], _Cursor],
        *,
        dialect: str,
        paramstyle: str,
        driver_errors: tuple[type[BaseException], ...],
        infrastructure: Callable[[BaseException], bool] = lambda exc: False,
        many: Callable[[str, Iterable[Params]], int],
        describe: Callable[[BaseException], str] = str,
    ) -> None:
        self._run = run
        self.dialect = dialect
        self.paramstyle = paramstyle
        self._driver_errors = driver_errors
        self._infrastructure = infrastructure
        self._many = many
        self._describe = describe
        self._open = True
        self._failure: SQLError | None = None

    def __repr__(self) -> str:
        state = "open" if self._open else "ended"
        return f"<cairn.Tx {self.dialect} ({state})>"

    def execute(self, sql: str, params: Params | None = None) -> Result:
        """Run one statement; its rows, fetched now."""
        self._check(sql)
        try:
            cursor = self._run(sql, params)
            rows = [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []
            columns = tuple(str(column[0]) for column in cursor.description or ())
            return Result(rows, columns, int(cursor.rowcount))
        except self._driver_errors as exc:
            raise self._failed(exc) from None

    def executemany(self, sql: str, seq_of_params: Iterable[Params]) -> int:
        """Run one statement once per parameter set; the rows changed, in total."""
        self._check(sql)
        try:
            return self._many(sql, seq_of_params)
        except self._driver_errors as exc:
            raise self._failed(exc) from None

    # -- what the store does with the handle -----------------------------------------

    def _check(self, sql: str) -> None:
        if not self._open:
            raise TransactionMisuse("this transaction has ended: a cairn.Tx is valid only inside the body "
                                    "of its transactional step")
        if not isinstance(sql, str):
            raise TransactionMisuse(f"a statement is text, not {type(sql).__name__}")
        if self._failure is not None:
            raise SQLError(f"an earlier statement of this transaction failed ({self._failure}); "
                           "the transaction will be rolled back")
        why = refusal(sql)
        if why is not None:
            raise TransactionMisuse(why)

    def _failed(self, exc: BaseException) -> BaseException:
        if self._infrastructure(exc):  # the database itself (a lost connection): not the step's failure
            return StoreError(f"the database failed during a transactional step: {self._describe(exc)}")
        self._failure = SQLError(f"{self.dialect}: {self._describe(exc)}")
        return self._failure

    def end(self) -> None:
        """The body returned (or raised): the handle is dead from now on."""
        self._open = False

    def doomed(self) -> SQLError | None:
        """The failure of a statement the body ran (caught or not): the
        transaction must not commit."""
        return self._failure
