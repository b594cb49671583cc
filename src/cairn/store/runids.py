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
``CHECK`` constraints on ``runs`` (migrations 0020 and 0021), which hold for
whatever SQL a tenant's role runs. SQLite has no roles: whoever can write its
file is its owner, so the rule in ``lifecycle`` is the whole boundary there.
"""

from __future__ import annotations

import urllib.parse

from cairn.errors import InvalidArgument

#: The prefix of every tick's run id, reserved: see ``check_run_id``.
RUN_ID_PREFIX = "schedule:"
#: The prefix of the ids a tenant chooses through the HTTP API (``scoped_run_id``).
TENANT_ID_PREFIX = "tenant:"
_RESERVED = (RUN_ID_PREFIX, TENANT_ID_PREFIX)


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


__all__ = ["RUN_ID_PREFIX", "TENANT_ID_PREFIX", "check_run_id", "id_part", "scoped_run_id", "tenant_prefix"]
