"""What ``app.schedules()`` and ``cairn schedules`` show about each schedule.

A schedule is declared in code (``App.schedule``) and registered in the
database by the workers that fire it. The listing merges both: the rows
(what the workers registered and how far they fired: no application code
needed) and, when the app is at hand, the declarations not registered yet
(no worker has run them). Times are given in UTC and in the schedule's own
time zone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cairn.engine.schedules import InvalidSchedule, Schedule, Timetable, tick_text
from cairn.store.schedules import ScheduleState


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as listed."""

    tenant: str
    name: str
    workflow: str
    cron: str
    timezone: str
    missed: str
    grace: float
    #: the token role its ticks' runs are started with (``None``: none)
    role: str | None
    #: declared by the app the listing was asked of (``None``: no app given)
    declared: bool | None
    #: a worker registered it in the database
    registered: bool
    #: the latest tick fired or passed over (UTC epoch seconds)
    last_tick: float | None
    #: the run the latest firing tick started, and how many runs it started in all
    last_run_id: str | None
    fired: int
    #: the next tick after now
    next_tick: float | None
    #: the oldest tick that is due and not fired yet: no worker fires this schedule
    #: (or one is about to); ``None`` normally
    due_since: float | None

    def local(self, at: float | None) -> datetime | None:
        """``at`` in the schedule's time zone (``None`` stays ``None``)."""
        if at is None:
            return None
        try:
            return Timetable.parse(self.cron, self.timezone).local(at)
        except InvalidSchedule:
            return None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON (``cairn schedules --json``): every time as UTC epoch
        seconds, as UTC text and as text in the schedule's zone."""

        def times(at: float | None) -> dict[str, Any] | None:
            if at is None:
                return None
            local = self.local(at)
            return {"epoch": at, "utc": tick_text(at), "local": None if local is None else local.isoformat()}

        return {
            "tenant": self.tenant, "name": self.name, "workflow": self.workflow, "cron": self.cron,
            "timezone": self.timezone, "missed": self.missed, "grace": self.grace, "role": self.role,
            "declared": self.declared, "registered": self.registered, "last_tick": times(self.last_tick),
            "last_run_id": self.last_run_id, "fired": self.fired, "next_tick": times(self.next_tick),
            "due_since": times(self.due_since),
        }


def list_views(states: Iterable[ScheduleState], declared: Mapping[tuple[str, str], Schedule] | None,
               now: float) -> list[ScheduleView]:
    """Registered rows and (when ``declared`` is given) the declarations,
    by tenant then name."""
    rows = {(state.tenant, state.name): state for state in states}
    keys = set(rows) | (set(declared) if declared is not None else set())
    return [_view(rows.get(key), None if declared is None else declared.get(key), declared is not None, now)
            for key in sorted(keys)]


def _view(state: ScheduleState | None, schedule: Schedule | None, with_app: bool, now: float) -> ScheduleView:
    if schedule is not None:  # the code is the truth for the definition
        tenant, name, workflow = schedule.tenant, schedule.name, schedule.workflow.name
        cron, zone, missed, grace = (schedule.timetable.cron, schedule.timetable.timezone, schedule.missed,
                                     schedule.grace)
        role = schedule.started_role
    else:
        assert state is not None
        spec = state.spec
        tenant, name, workflow, cron, zone, missed, grace = (spec.tenant, spec.name, spec.workflow, spec.cron,
                                                             spec.timezone, spec.missed, spec.grace)
        role = spec.started_role
    next_tick = due_since = None
    try:
        timetable = Timetable.parse(cron, zone)
        next_tick = timetable.next_after(now)
        if state is not None:
            first = timetable.next_after(state.after)
            due_since = first if first <= now else None
    except (InvalidSchedule, StopIteration):  # a row written by another version, or damaged
        pass
    return ScheduleView(
        tenant=tenant, name=name, workflow=workflow, cron=cron, timezone=zone, missed=missed, grace=grace,
        role=role, declared=(schedule is not None) if with_app else None, registered=state is not None,
        last_tick=None if state is None else state.last_tick,
        last_run_id=None if state is None else state.last_run_id,
        fired=0 if state is None else state.fired, next_tick=next_tick, due_since=due_since,
    )
