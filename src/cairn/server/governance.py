"""``/api/audit/log`` and ``/api/keys``: who did what, and the state of the
encryption keys, over the API (issue 26; ``cairn audit log`` and ``cairn
keys status`` / ``verify`` on the command line).

Both are for a tenant's admins, and always of the token's tenant: the CLI
reads every tenant (its operator runs the installation); a token never names
another tenant, and a run of another tenant is the 404 an unknown id gets.
The log is ``Audit.log_page`` filtered to the tenant (its runs' entries, hot
and archived, and its operator log records; the installation's own records,
with no tenant, are not a tenant's), a page at a time: ``next_after`` gives
the next page's ``after``, a cursor that holds a place in the log and no
tenant (``api.auditlog``); text that is not base64url is a 400, base64url the log did not give a 422
(the OpenAPI contract: a value its schema admits is never a 400). The key routes answer ids, versions, counts
and the places that fail to open, never a key's material (a data key is
stored wrapped and never leaves ``cairn.security``): what ``--json`` prints.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from cairn.api.auditlog import MAX_CURSOR, AuditEvent, LogFilter
from cairn.api.keys import Keys
from cairn.api.tokens import Role
from cairn.errors import ConfigError, InvalidArgument
from cairn.server.errors import ApiError
from cairn.server.routing import Call, Endpoint, Ident
from cairn.store.sealed import SealedStore

#: what a cursor is made of (``api.auditlog.cursor_of``: unpadded base64url); other text is a 400
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"

Cursor = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CURSOR, pattern=CURSOR_PATTERN)]

#: the most log entries one page answers (the CLI's default is 200); more come page by page
MAX_LOG = 1000


class LogQuery(msgspec.Struct):
    """``cairn audit log``'s filters; ``since`` is a Unix time (seconds);
    ``after`` the ``next_after`` of the page before; ``order`` newest first
    (from the last entry back) or oldest first."""

    run_id: Ident | None = None
    actor: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    event: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    since: Annotated[float, msgspec.Meta(ge=0)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_LOG)] = 200
    after: Cursor | None = None
    order: Literal["newest", "oldest"] = "newest"


class LogOut(msgspec.Struct, kw_only=True):
    """A page of the log (``cairn audit log --json``'s objects) and the
    ``after`` of the next page (``None``: this is the last)."""

    entries: list[AuditEvent]
    next_after: str | None


class KeyVersionOut(msgspec.Struct, kw_only=True):
    version: int
    kek: str
    created_at: float


class KeysOut(msgspec.Struct, kw_only=True):
    """The tenant's data key versions (the KEK id wrapping each) and how
    many values and artifacts each seals (``0``: plaintext artifacts)."""

    tenant: str
    encrypted: bool
    versions: list[KeyVersionOut]
    values: dict[str, int]
    old: int
    old_artifacts: int
    artifacts: dict[str, int]


class VerifiedOut(msgspec.Struct, kw_only=True):
    """What ``cairn keys verify`` reports: the runs and artifacts opened, and each failure by place."""

    tenant: str
    runs: int
    artifacts: int
    failures: list[str]


def audit_log(call: Call[Any]) -> Any:
    query: LogQuery = call.query
    run_id = None if query.run_id is None else call.run(query.run_id).run_id
    wanted = LogFilter(call.principal.tenant, run_id, query.actor, query.event, query.since, query.kind)
    try:
        found = call.app.audit.log_page(wanted, query.limit, after=query.after,
                                        newest=query.order == "newest")
    except InvalidArgument as exc:  # base64url, but no position the log gave: well-formed, not acceptable
        raise ApiError(422, "invalid", str(exc)) from None
    return {"entries": [item.as_dict() for item in found.entries], "next_after": found.next_after}


def key_status(call: Call[Any]) -> Any:
    tenant = call.principal.tenant
    if not isinstance(call.app.store, SealedStore):
        return {"tenant": tenant, "encrypted": False, "versions": [], "values": {}, "old": 0,
                "old_artifacts": 0, "artifacts": {}}
    (found,) = Keys(call.app.store).status(tenant)
    return {"encrypted": True, **found.as_dict()}


def verify_keys(call: Call[Any]) -> Any:
    try:
        keys = Keys(call.app.store)
    except ConfigError as exc:  # encryption is off: the database's state, not a bad request
        raise ApiError(409, "conflict", str(exc)) from None
    (report,) = keys.verify(call.principal.tenant)
    return {"tenant": report.tenant, "runs": report.runs, "artifacts": report.artifacts,
            "failures": report.failures}


ROUTES = [
    Endpoint("GET", "/api/audit/log", Role.ADMIN, "Who did what in the tenant: its runs' entries and its "
             "operator actions, each with its actor and how it was authenticated (cairn audit log), a page "
             "at a time, newest first unless order=oldest",
             audit_log, query=LogQuery, tag="governance", response=LogOut),
    Endpoint("GET", "/api/keys", Role.ADMIN, "The tenant's data key versions and what each seals "
             "(ids and counts, never key material)", key_status, tag="governance", response=KeysOut),
    Endpoint("GET", "/api/keys/verify", Role.ADMIN, "Open every sealed value and artifact of the tenant; "
             "list what does not open (cairn keys verify)", verify_keys, tag="governance",
             response=VerifiedOut),
]
