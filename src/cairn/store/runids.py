"""The reserved namespaces of run ids: a tenant's own ids and its schedule ticks.

Run ids are one namespace in the store (the primary key of ``runs``), so an
id one tenant may choose freely could be taken, or probed, by another: a
``409`` for an id another tenant holds tells that it exists, and a squatter
that guesses a predictable id (a tick's, a client's order number) makes the
owner's start fail. Two prefixes are therefore reserved, each for the tenant
it names, percent-encoded, then ``:``:

* ``tenant:<tenant>:`` -- the ids a tenant chooses through the HTTP API
  (``scoped_run_id``): two tenants may both start ``order-42``, and each gets
  a run of its own, ``tenant:acme:order-42`` and ``tenant:globex:order-42``;
  neither learns anything of the other. Children derive their ids from their
  parent's, so they stay in the parent's namespace.
* ``schedule:<tenant>:`` -- the ids of schedule ticks (``schedule:<tenant>:
  <name>:<UTC time>``, derived so that every worker asks for the same run).

``check_run_id`` refuses an id in either namespace that is not the run's own
tenant's. Every backend applies it where a run is created
(``lifecycle.create``, ``lifecycle.create_claimed``); PostgreSQL also in
``CHECK`` constraints on ``runs`` (migrations 0020 and 0022), which hold for
whatever SQL a tenant's role runs. SQLite has no roles: whoever can write its
file is its owner, so the rule in ``lifecycle`` is the whole boundary there.

It also holds the one rule every id a run is created with must follow
(``check_id``: run, thread and child ids, queues; tenants and workflow
names are free text but for a NUL: ``records.check_names``), on every path
(``App.start``, ``ctx.start_child``, the HTTP API, schedules) and every
backend, because ``NewRun`` applies it. An id is text
that travels: in URLs (the dashboard cannot open ``/runs/..``), in
Server-Sent Events lines (a line break in an id forges an event), in
SQLite's JSON functions (a NUL cuts the text short, so the claim of a batch
holding such an id could not find its row) and in PostgreSQL (whose text
holds no NUL at all). So it is 1 to ``MAX_ID_LENGTH`` characters, not ``.``
or ``..``, with no control character (C0, DEL, C1) and no lone surrogate.
"""

from __future__ import annotations

import re
import urllib.parse

from cairn.errors import InvalidArgument

#: The prefix of every tick's run id, reserved: see ``check_run_id``.
RUN_ID_PREFIX = "schedule:"
#: The prefix of the ids a tenant chooses through the HTTP API (``scoped_run_id``).
TENANT_ID_PREFIX = "tenant:"
_RESERVED = (RUN_ID_PREFIX, TENANT_ID_PREFIX)


#: The longest id or name (in characters) a run may be created with.
MAX_ID_LENGTH = 200
#: ``check_id``'s rule as a regular expression, for the HTTP API's request
#: types and its OpenAPI document (the same in Python's ``re`` and in
#: ECMAScript: ``$(?!\n)`` is the end of the text in both, where Python's
#: plain ``$`` also matches before a final line feed).
ID_PATTERN = r"^(?!\.\.?$)[^\x00-\x1f\x7f-\x9f]+$(?!\n)"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def id_problem(value: str) -> str | None:
    """What is wrong with ``value`` as an id (``check_id``), or ``None``."""
    if not isinstance(value, str):
        return f"must be text, not {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"is {len(value)} characters long; at most {MAX_ID_LENGTH} are allowed"
    if value in (".", ".."):
        return "must not be '.' or '..' (a path segment that means another place in a URL)"
    control = _CONTROL.search(value)
    if control is not None:
        return (f"holds the control character U+{ord(control.group()):04X} at index {control.start()} "
                "(NUL, line breaks and other control characters are not allowed)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "holds text that is not valid Unicode (a lone surrogate)"
    return None


def check_id(what: str, value: str) -> None:
    """Refuse ``value`` as the ``what`` of a run (``"run id"``, ``"queue"``)
    with one ``InvalidArgument`` naming the problem (see the module doc)."""
    problem = id_problem(value)
    if problem is not None:
        shown = value[:60] + "..." if isinstance(value, str) and len(value) > 60 else value
        raise InvalidArgument(f"{what} {shown!r} {problem}")


def unclaimable(run_id: str) -> str | None:
    """Why a stored run's id cannot go through a claim with the others of
    its batch, or ``None``: a NUL (SQLite's JSON functions end the text
    there). Such a row is older than ``check_id`` or was written behind
    Cairn's back; the claim sets it aside as damaged."""
    if "\x00" in run_id:
        return f"its run id holds a NUL character at index {run_id.index(chr(0))}"
    return None


def id_part(text: str) -> str:
    """``text`` as one part of a reserved run id: every byte but ASCII letters,
    digits and ``-._~`` percent-encoded (so no ``:`` is left to confuse the
    parts); PostgreSQL's ``url_quote`` (migration 0020) encodes the same."""
    return urllib.parse.quote(text, safe="")


def tenant_prefix(tenant: str, namespace: str = RUN_ID_PREFIX) -> str:
    """How every run id of ``tenant`` in ``namespace`` begins (by default the
    namespace of its schedules' ticks)."""
    return f"{namespace}{id_part(tenant)}:"


def scoped_run_id(tenant: str, run_id: str) -> str:
    """The run id ``run_id`` as chosen by ``tenant`` through the HTTP API: in
    that tenant's own namespace, so no other tenant can hold it or learn
    whether it exists. Idempotent: an id already in the tenant's namespace is
    returned as it is (a client may name a run by the id it was given)."""
    prefix = tenant_prefix(tenant, TENANT_ID_PREFIX)
    return run_id if run_id.startswith(prefix) else prefix + run_id


def check_run_id(run_id: str, tenant: str) -> None:
    """Refuse a run id in a reserved namespace (``schedule:``, ``tenant:``)
    that is not this tenant's: the only ids there a run of ``tenant`` may
    take begin ``<namespace><tenant, encoded>:``."""
    for namespace in _RESERVED:
        if run_id.startswith(namespace) and not run_id.startswith(tenant_prefix(tenant, namespace)):
            raise InvalidArgument(
                f"run id {run_id!r} is reserved: ids beginning {namespace!r} belong to the tenant they "
                f"name, and a run of this tenant may only take one beginning "
                f"{tenant_prefix(tenant, namespace)!r}")


__all__ = ["ID_PATTERN", "MAX_ID_LENGTH", "RUN_ID_PREFIX", "TENANT_ID_PREFIX", "check_id", "check_run_id",
           "id_part", "id_problem", "scoped_run_id", "tenant_prefix", "unclaimable"]
