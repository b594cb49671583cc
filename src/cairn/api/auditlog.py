"""Who did what, a page at a time (issue 26): the audit log's entries, each
with its actor and how it was authenticated (``cairn audit log``,
``GET /api/audit/log``).

The log is three streams merged in ``(at, run_id, seq)`` order, each
already in that order and each read past the cursor as the merge asks for
it, so a page's cost does not grow with the tenant's history: the hot
history (the store's ``audit_log_rows``: run by run by primary key, a run
read only once the merge reaches its time), the archived runs' entries
(``archived``: only the archives whose recorded time range reaches the page
are opened) and the operator log's records (``operator_log_rows``, a page
at a time by ``operator_log_at``). A page is
what the merge gives past a position, in either direction; its cursor is
that position, the last entry answered, encoded. The cursor carries no
tenant: the caller's tenant scopes every stream, so a cursor made up from
another tenant's run id only places the page among the caller's own
entries.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from cairn.errors import InvalidArgument
from cairn.store import oplog
from cairn.store.contract import Store
from cairn.store.logmerge import lazy_merge

#: An entry's place in the log: ``(at, run_id, seq)``, unique (a run's
#: ``seq``, or an operator log chain's record number, is its own).
Position = tuple[float, str, int]

#: The longest cursor accepted (a position's JSON, base64: a run id is at most 255 characters).
MAX_CURSOR = 512

#: Hot rows read per page of the store when entries are filtered after they are read (by actor or
#: event): a page of the log may then need many of them.
FILTERED_PAGE = 2000


class AuditEvent(msgspec.Struct, frozen=True):
    """One entry of the log: who did what, when: a run's history entry
    (``kind`` ``run``) or an operator log record (``kind`` its object's:
    ``token``, ``queue``, ``key``...). ``--json``'s object and the HTTP
    answer's, field for field."""

    at: float
    tenant: str
    run_id: str
    seq: int
    event: str
    actor: str
    auth: str
    detail: dict[str, Any] | None
    #: what was acted on: ``run`` (a history entry, ``object_id`` the run) or
    #: an operator log record's object (``token``, ``queue``, ``key``...; ``run_id``
    #: is then its chain's id, ``event`` its action, ``detail`` what changed)
    kind: str
    object_id: str

    def as_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


@dataclass(frozen=True, slots=True)
class LogFilter:
    """Which entries: of a tenant, of a run, by an actor (a substring), of an
    event or operator action (a prefix), of a kind of object, since a time."""

    tenant: str | None = None
    run_id: str | None = None
    actor: str | None = None
    event: str | None = None
    since: float | None = None
    kind: str | None = None

    def admits(self, item: AuditEvent) -> bool:
        return ((self.actor is None or self.actor in item.actor)
                and (self.event is None or item.event.startswith(self.event))
                and (self.since is None or item.at >= self.since))


@dataclass(frozen=True, slots=True)
class LogPage:
    """A page of the log and the cursor of the page after it (``None``: the last)."""

    entries: list[AuditEvent]
    next_after: str | None


def position(item: AuditEvent) -> Position:
    return (item.at, item.run_id, item.seq)


def cursor_of(where: Position) -> str:
    """The cursor of a position: base64url of its JSON, unpadded."""
    text = json.dumps([where[0], where[1], where[2]], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def position_of(cursor: str) -> Position:
    """The position a cursor holds; ``InvalidArgument`` if it is not a cursor this log gave."""
    problem = (f"the cursor {cursor[:40]!r} is not one the audit log gave "
               "(pass a page's next_after back as it is)")
    if not cursor or len(cursor) > MAX_CURSOR:
        raise InvalidArgument(problem)
    try:
        found = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidArgument(problem) from None
    if (not isinstance(found, list) or len(found) != 3 or type(found[0]) not in (int, float)
            or type(found[1]) is not str or type(found[2]) is not int):
        raise InvalidArgument(problem)
    return (float(found[0]), found[1], found[2])


def page(store: Store, wanted: LogFilter, limit: int, *, newest: bool,
         after: Position | None = None) -> LogPage:
    """At most ``limit`` entries past ``after``, newest first if ``newest``."""
    found = list(itertools.islice(entries(store, wanted, after, newest=newest, limit=limit), limit + 1))
    more = len(found) > limit
    shown = found[:limit]
    return LogPage(shown, cursor_of(position(shown[-1])) if more else None)


def entries(store: Store, wanted: LogFilter, after: Position | None, *, newest: bool,
            limit: int | None = None) -> Iterator[AuditEvent]:
    """The entries ``wanted`` past ``after``, in log order (reversed if
    ``newest``), each stream read as the merge asks for it."""
    filtered = wanted.actor is not None or wanted.event is not None
    page_rows = FILTERED_PAGE if filtered or limit is None else min(limit + 1, FILTERED_PAGE)
    streams: list[Iterable[AuditEvent]] = []
    if wanted.kind in (None, "run"):
        rows = store.audit_log_rows(  # type: ignore[attr-defined]
            tenant=wanted.tenant, run_id=wanted.run_id, since=wanted.since, after=after, newest=newest,
            page=page_rows)
        streams.append(map(event_of, rows))
        streams.append(archived(store, wanted, after, newest))
    if wanted.run_id is None and wanted.kind != "run" and hasattr(store, "operator_log_rows"):
        records = store.operator_log_rows(
            tenant=wanted.tenant, kind=wanted.kind, since=wanted.since, after=after, newest=newest,
            page=page_rows if wanted.kind is None else FILTERED_PAGE)
        streams.append(map(record_of, records))
    return (item for item in heapq.merge(*streams, key=position, reverse=newest) if wanted.admits(item))


def archived(store: Store, wanted: LogFilter, after: Position | None, newest: bool) -> Iterator[AuditEvent]:
    """The archived runs' entries past ``after``, in log order (reversed if
    ``newest``). The store gives the archives in the order their entries
    start (``audit_log_archives``); one is opened only when the next entry
    to give is not before its start (``store.logmerge``), so a page opens
    the archives its entries come from (and those whose range straddles
    it), not every archive of the tenant."""
    records = store.audit_log_archives(  # type: ignore[attr-defined]
        tenant=wanted.tenant, run_id=wanted.run_id, after=after, since=wanted.since, newest=newest)

    def opener(record: Any) -> Callable[[], list[AuditEvent]]:
        return lambda: _ordered((event_of(_log_columns(row)) for row in store.archived_history(record)),  # type: ignore[attr-defined]
                                after, newest)

    return lazy_merge(((start, opener(record)) for start, record in records), position,
                      lambda item: item.at, newest=newest)


def _ordered(items: Iterable[AuditEvent], after: Position | None, newest: bool) -> list[AuditEvent]:
    """``items`` past ``after``, sorted in log order (reversed if ``newest``)."""
    if after is None:
        kept = list(items)
    elif newest:
        kept = [item for item in items if position(item) < after]
    else:
        kept = [item for item in items if position(item) > after]
    kept.sort(key=position, reverse=newest)
    return kept


def _log_columns(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """An entry's ``auditsql.LOG_COLUMNS`` from its ``ENTRY_COLUMNS``."""
    return (row[0], row[1], row[2], row[3], row[4], row[5], row[14], row[17])


def record_of(row: tuple[Any, ...]) -> AuditEvent:
    """The log's view of an operator log row (``oplog.COLUMNS``)."""
    try:
        change = json.loads(row[8])
    except (ValueError, TypeError):
        change = {"damaged": str(row[8])[:200]}
    return AuditEvent(float(row[2]), str(row[0]), oplog.chain_id(str(row[0])), int(row[1]), str(row[5]),
                      str(row[6]), str(row[7]), change if isinstance(change, dict) else {"value": change},
                      str(row[3]), str(row[4]))


def event_of(row: tuple[Any, ...]) -> AuditEvent:
    """The log's view of a stored entry (``auditsql.LOG_COLUMNS``). A
    sealed detail shows only its plaintext keys (the actor is one)."""
    detail: Any = None
    if row[6] is not None:
        try:
            detail = json.loads(row[6])
        except (ValueError, TypeError):
            detail = {"damaged": str(row[6])[:200]}
    if not isinstance(detail, dict):
        detail = None if detail is None else {"value": detail}
    who, auth = actor_of(str(row[2]), row[5], int(row[4]), detail)
    run_id = str(row[0])
    return AuditEvent(float(row[3]), str(row[7]), run_id, int(row[1]), str(row[2]), who, auth, detail, "run",
                      run_id)


def actor_of(event: str, worker: Any, epoch: int, detail: dict[str, Any] | None) -> tuple[str, str]:
    """Who wrote an entry and how they were authenticated: a run's starter
    (its ``run.created`` entry's ``started_by``), an operator's
    (``detail.actor``; the prefix says how: ``cli:`` the OS user, ``user:``
    a configured identity, ``http:`` an API token, ``app:`` a program
    in-process), a lease holder's (the worker, by its lease epoch), else the
    system's."""
    started = detail.get("started_by") if detail is not None and event == "run.created" else None
    if isinstance(started, dict) and isinstance(started.get("actor"), str):
        return str(started["actor"]), str(started.get("auth") or "unknown")
    if detail is not None and isinstance(detail.get("actor"), str):
        actor = str(detail["actor"])
        return actor, str(detail.get("auth") or AUTH.get(actor.partition(":")[0], "unknown"))
    if worker is not None:
        return f"worker:{worker}", f"lease epoch {epoch}"
    return "system", "none"


#: how each kind of operator actor was authenticated (its prefix)
AUTH = {"cli": "os-user", "user": "configured", "http": "api-token", "app": "in-process",
        "schedule": "schedule", "run": "parent-run"}
