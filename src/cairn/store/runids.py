"""The reserved namespace of run ids: the ids of schedule ticks.

Run ids are one namespace for every tenant, and a tick's id is predictable
(``schedule:<tenant>:<name>:<UTC time>``, derived so that every worker asks
for the same run). Without a rule, another tenant could take a tick's id
before its time and the tick would start nothing. So an id beginning
``schedule:`` must go on with its own run's tenant, percent-encoded, then
``:`` (``check_run_id``). Every backend applies it where a run is created
(``lifecycle.create``, ``lifecycle.create_claimed``); PostgreSQL also in a
``CHECK`` on ``runs`` (migration 0020), which holds for whatever SQL a
tenant's role runs. SQLite has no roles: whoever can write its file is its
owner, so the rule in ``lifecycle`` is the whole boundary there.
"""

from __future__ import annotations

import urllib.parse

from cairn.errors import InvalidArgument

#: The prefix of every tick's run id, reserved: see ``check_run_id``.
RUN_ID_PREFIX = "schedule:"


def id_part(text: str) -> str:
    """``text`` as one part of a tick's run id: every byte but ASCII letters,
    digits and ``-._~`` percent-encoded (so no ``:`` is left to confuse the
    parts); PostgreSQL's ``url_quote`` (migration 0020) encodes the same."""
    return urllib.parse.quote(text, safe="")


def tenant_prefix(tenant: str) -> str:
    """How the run id of every tick of ``tenant``'s schedules begins."""
    return f"{RUN_ID_PREFIX}{id_part(tenant)}:"


def check_run_id(run_id: str, tenant: str) -> None:
    """Refuse a run id in the reserved ``schedule:`` namespace that is not
    this tenant's: the only ids there a run of ``tenant`` may take begin
    ``schedule:<tenant, encoded>:``."""
    if run_id.startswith(RUN_ID_PREFIX) and not run_id.startswith(tenant_prefix(tenant)):
        raise InvalidArgument(
            f"run id {run_id!r} is reserved: ids beginning {RUN_ID_PREFIX!r} are those of schedule ticks, "
            f"and a run of this tenant may only take one beginning {tenant_prefix(tenant)!r}")


__all__ = ["RUN_ID_PREFIX", "check_run_id", "id_part", "tenant_prefix"]
