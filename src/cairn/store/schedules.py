"""What the store keeps about schedules: the records of the ``schedules`` table.

Schedules are declared in code (``App.schedule``); what must survive every
worker's restart lives here, one row per (tenant, schedule name): the
definition the workers last registered (for ``cairn schedules``, which needs
no application code) and the *last fired tick*, which is what makes firing
exactly once and what the missed-tick policy is computed from.

The rule that makes a tick fire once (``Store.fire_schedule``): in one
transaction, a tick later than the row's ``last_tick`` creates its run (an id
derived from the schedule and the tick, so even a lost row cannot make a
second one) and moves ``last_tick`` up to it; a tick at or before
``last_tick`` changes nothing. ``last_tick`` never goes back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from cairn.store.records import NewRun
from cairn.store.rows import DamagedRow

#: How missed ticks (due while no worker ran) are handled; see ``cairn.engine.schedules``.
MISSED_POLICIES = ("skip", "once", "all")


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule's definition as a worker registers it (checked by
    ``cairn.engine.schedules`` before it gets here)."""

    tenant: str
    name: str
    workflow: str
    #: the cron expression (5 fields, or 6 with seconds first)
    cron: str
    #: IANA time zone the cron expression is read in
    timezone: str
    #: ``skip``, ``once`` or ``all``
    missed: str
    #: seconds after its time within which a tick still fires on time
    grace: float
    #: the token role its ticks' runs are started with, as registered (shown;
    #: a tick's run takes it from the declaration in code: ``engine.schedules``)
    started_role: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A row of ``schedules``: the registered definition and how far it fired."""

    spec: ScheduleSpec
    #: when the schedule was first registered (store clock): no tick before it fires
    created_at: float
    #: when a worker last registered it
    updated_at: float
    #: the latest tick fired or passed over (UTC epoch seconds); ``None``: none yet
    last_tick: float | None
    #: the run of the latest tick that started one
    last_run_id: str | None
    #: when that run was created (store clock)
    fired_at: float | None
    #: how many runs the schedule has started
    fired: int

    @property
    def tenant(self) -> str:
        return self.spec.tenant

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def after(self) -> float:
        """Ticks later than this are still to fire."""
        return self.created_at if self.last_tick is None else self.last_tick


class Fired(enum.Enum):
    """What ``Store.fire_schedule`` did with one tick."""

    #: the tick's run was created and ``last_tick`` moved up to the tick
    CREATED = "created"
    #: a run of this tenant already had the tick's id (a state lost, or made
    #: by hand): nothing created, ``last_tick`` moved up
    EXISTED = "existed"
    #: no run was asked for (a skipped tick): ``last_tick`` moved up
    PASSED = "passed"
    #: a run this store cannot read (another tenant's, written before ids under
    #: ``schedule:`` were reserved: ``store.runids``) holds the tick's id:
    #: nothing created, ``last_tick`` moved up so later ticks still fire
    TAKEN = "taken"
    #: ``last_tick`` was already at or after the tick (another worker fired
    #: it, or passed over it): nothing changed
    STALE = "stale"
    #: no such schedule is registered: nothing changed
    MISSING = "missing"


def check_tick_run(tenant: str, run: NewRun | None) -> None:
    """A tick's run belongs to its schedule's tenant: anything else is a bug
    in the caller, refused before anything is written."""
    if run is not None and run.tenant != tenant:
        raise ValueError(f"a run of tenant {run.tenant!r} cannot be a tick of a schedule of "
                         f"tenant {tenant!r}")


def schedule_params(spec: ScheduleSpec, now: float) -> dict[str, Any]:
    return {"tenant": spec.tenant, "name": spec.name, "workflow": spec.workflow, "cron": spec.cron,
            "timezone": spec.timezone, "missed": spec.missed, "grace": spec.grace,
            "started_role": spec.started_role, "now": now}


#: the columns every ``select_schedule*`` query returns, in order
def schedule_from_row(row: Any) -> ScheduleState:
    """A row of ``schedules``; ``DamagedRow`` naming the schedule if a column
    does not hold what it must (an edited SQLite file: its columns are not typed)."""
    (tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at, last_tick,
     last_run_id, fired_at, fired, started_role) = row
    try:
        spec = ScheduleSpec(_text(tenant), _text(name), _text(workflow), _text(cron), _text(timezone),
                            _text(missed), _number(grace),
                            None if started_role is None else _text(started_role))
        return ScheduleState(spec, _number(created_at), _number(updated_at),
                             None if last_tick is None else _number(last_tick),
                             None if last_run_id is None else _text(last_run_id),
                             None if fired_at is None else _number(fired_at), int(fired))
    except (TypeError, ValueError) as exc:
        raise DamagedRow(f"schedule {name!r} of tenant {tenant!r} is damaged: {exc}") from None


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    return float(value)
