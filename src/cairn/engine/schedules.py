"""Schedules: a workflow started on a cron timetable, once per tick.

``App.schedule`` declares one in code; the worker's scheduler
(``cairn.worker.scheduler``) fires it. This module holds what both need and
nothing that touches a database: the declaration (``Schedule``, checked at
registration so a bad expression, time zone or workflow fails at import with
one line), the timetable (``Timetable``: cron expressions read in an IANA time
zone, through ``cronsim``), the run id of a tick and which ticks are due
(``due``, a pure function of the schedule's stored state and "now").

Why these choices:

* **cronsim** for the cron arithmetic: maintained (it serves Healthchecks.io),
  typed, made for ``zoneinfo``, and it follows Debian cron across daylight
  saving changes: a job at a fixed local time (``30 2 * * *``) that falls in
  the hour skipped in spring runs once right after the change, and once (not
  twice) in the hour repeated in autumn; a job of every few minutes or hours
  (``*/15 * * * *``) keeps its pace in real time through both changes. A
  sixth field in front is seconds (``*/2 * * * * *``: every two seconds).
* **A tick's run id is derived, never generated**: ``schedule:`` + tenant +
  name + the tick's UTC time (``2026-12-01T08:25:00Z``), tenant and name
  percent-encoded so no two (tenant, name) pairs can produce one id. Every
  worker that fires a tick asks for the same run, so ``create_run``'s
  idempotency alone already forbids a second run; the store's ``fire_schedule``
  adds the per-schedule ``last_tick`` that the missed policy needs.
* **Missed ticks** are ticks more than ``grace`` seconds old when a worker
  first sees them: every worker was down (or the store was) when they were
  due. ``missed="once"`` (the default) starts one catch-up run, for the latest
  missed tick, then carries on; ``"skip"`` starts none; ``"all"`` starts one
  per missed tick, oldest first (at most ``MAX_TICKS_PER_PASS`` per pass).
  Ticks within ``grace`` always fire, whatever the policy: a worker that was
  busy or restarting for a few seconds misses nothing. A schedule's first
  registration is its origin: no tick before it ever fires.
* **The role a tick's run acts with** is declared with the schedule
  (``role=``, default none), like its workflow and arguments: a run started
  by the app's own timetable has the rights the app's code gives it
  (``cairn.ToolAccess(role=...)`` checks them), recorded on its row as a
  token's would be. The schedule's row shows the role the workers last
  registered; the run takes it from the declaration, as it takes everything
  else, so a row edited in the database raises no tick's rights.
* **Arguments** are fixed at declaration (``kwargs=``, encoded and checked
  against the workflow's signature then, as ``app.start`` would), and the
  tick's time can be passed in as one more argument (``tick_arg=``: a UTC
  ``datetime``), so a run knows which tick it serves and its input differs
  per tick.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from cairn.codec import values
from cairn.engine.definitions import WorkflowDef
from cairn.errors import InvalidArgument
from cairn.store.records import STARTED_ROLES, NewRun
from cairn.store.runids import id_part, id_problem, tenant_prefix
from cairn.store.schedules import MISSED_POLICIES, ScheduleSpec, ScheduleState

#: A worker fires at most this many ticks of one schedule per pass (the rest
#: on the next pass, at once): bounds one pass after a long outage under
#: ``missed="all"`` or a long ``grace``.
MAX_TICKS_PER_PASS = 100

#: Default seconds after its time within which a tick still counts as on time.
DEFAULT_GRACE = 60.0

class InvalidSchedule(InvalidArgument):
    """A schedule that cannot be declared: a malformed cron expression, an
    unknown time zone or workflow, arguments that do not fit, a name taken."""


@dataclass(frozen=True, slots=True)
class Timetable:
    """When a schedule ticks: a cron expression read in a time zone."""

    cron: str
    timezone: str
    zone: ZoneInfo = field(compare=False, repr=False)

    @classmethod
    def parse(cls, cron: str, timezone: str, *, what: str = "schedule") -> Timetable:
        """``InvalidSchedule`` naming the problem for a bad expression or zone."""
        if not isinstance(cron, str) or not cron.strip():
            raise InvalidSchedule(f"{what}: the cron expression is empty")
        expression = " ".join(cron.split())
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise InvalidSchedule(f"{what}: unknown time zone {timezone!r} (an IANA name such as "
                                  f"'Europe/Paris' or 'UTC')") from None
        fields = len(expression.split())
        if fields not in (5, 6):
            raise InvalidSchedule(f"{what}: invalid cron expression {cron!r}: it has {fields} fields; "
                                  f"give 5 (minute hour day month weekday) or 6 (seconds first)")
        table = cls(expression, timezone, zone)
        try:
            table.next_after(datetime.now(UTC).timestamp())
        except CronSimError as exc:
            raise InvalidSchedule(f"{what}: invalid cron expression {cron!r}: {exc}") from None
        except StopIteration:
            raise InvalidSchedule(f"{what}: cron expression {cron!r} never fires") from None
        return table

    def _iterate(self, after: float, *, reverse: bool = False) -> Iterator[float]:
        """Tick times (UTC epoch seconds, whole seconds) strictly after
        ``after``, ascending; with ``reverse``, at or before ``after``,
        descending. Ends after 50 years without a tick (cronsim's limit)."""
        if reverse:
            # cronsim's reverse iteration starts strictly before its origin
            # (whole seconds): start one second after the last second <= after
            origin = datetime.fromtimestamp(math.floor(after) + 1, self.zone)
        else:
            origin = datetime.fromtimestamp(math.floor(after), self.zone)
        last: float | None = None
        for moment in CronSim(self.cron, origin, reverse=reverse):
            at = moment.timestamp()
            # Local times that repeat in autumn: cronsim works on wall-clock
            # times and may hand back the first pass of a time already gone
            # (in real time): never go back.
            if (at <= after) if not reverse else (at > after):
                continue
            if last is not None and (at <= last if not reverse else at >= last):
                continue
            last = at
            yield at

    def next_after(self, after: float) -> float:
        """The first tick strictly after ``after``; ``StopIteration`` if none in 50 years."""
        return next(self._iterate(after))

    def last_at_or_before(self, at: float) -> float | None:
        """The latest tick at or before ``at`` (``None``: none in 50 years)."""
        return next(self._iterate(at, reverse=True), None)

    def ticks(self, after: float, until: float, limit: int) -> list[float]:
        """Ticks in (``after``, ``until``], oldest first, at most ``limit``."""
        found: list[float] = []
        for tick in self._iterate(after):
            if tick > until or len(found) >= limit:
                break
            found.append(tick)
        return found

    def local(self, at: float) -> datetime:
        """``at`` as an aware datetime in this timetable's zone."""
        return datetime.fromtimestamp(at, self.zone)


def tick_text(tick: float) -> str:
    """The UTC time of a tick as it appears in run ids: ``2026-12-01T08:25:00Z``."""
    return datetime.fromtimestamp(tick, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_run_id(tenant: str, name: str, tick: float) -> str:
    """The run id of ``tick`` of schedule (``tenant``, ``name``): the same on
    every worker, unique per (tenant, name, tick). ``:`` and ``%`` in names
    are percent-encoded, so the three parts can always be told apart (and
    the tenant's is the one ``store.runids.check_run_id`` requires)."""
    return f"{tenant_prefix(tenant)}{id_part(name)}:{tick_text(tick)}"


@dataclass(frozen=True, slots=True)
class Due:
    """What a pass of the scheduler does with one schedule."""

    #: ticks that start a run, oldest first
    fire: tuple[float, ...]
    #: the latest missed tick passed over without a run (``missed="skip"``)
    pass_over: float | None
    #: ticks missed in all (for the log), whether fired or passed over
    missed: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """A declared schedule (``App.schedule``): which workflow, when, with
    what arguments, for which tenant, and what to do about missed ticks."""

    name: str
    tenant: str
    workflow: WorkflowDef
    timetable: Timetable
    #: the workflow's fixed arguments, JSON-encoded (checked at declaration)
    arguments: bytes
    #: the parameter that receives the tick's time, if any
    tick_arg: str | None
    missed: str
    grace: float
    queue: str
    priority: int
    #: the token role each tick's run is started with (``None``: none)
    started_role: str | None = None

    @classmethod
    def declare(
        cls,
        cron: str,
        workflow: WorkflowDef,
        *,
        name: str | None,
        tenant: str,
        timezone: str,
        kwargs: Mapping[str, Any] | None,
        tick_arg: str | None,
        missed: str,
        grace: float,
        queue: str,
        priority: int,
        role: str | None = None,
    ) -> Schedule:
        """Check everything now: the error names the schedule and the problem."""
        label = workflow.name if name is None else name
        what = f"schedule {label!r}"
        for part, value in (("name", label), ("tenant", tenant), ("queue", queue)):
            if not isinstance(value, str) or not value:
                raise InvalidSchedule(f"{what}: the {part} must be a non-empty string, not {value!r}")
        # every tick's run id must pass the id rule, or each tick would be refused when due
        problem = id_problem(tick_run_id(tenant, label, 4102444800.0))  # 2100-01-01: the longest time text
        if problem is not None:
            raise InvalidSchedule(f"{what}: its ticks' run ids (schedule:<tenant>:<name>:<time>, the "
                                  f"tenant and name percent-encoded) would be refused: the id {problem}; "
                                  "use a shorter name")
        if missed not in MISSED_POLICIES:
            raise InvalidSchedule(f"{what}: missed must be one of {', '.join(map(repr, MISSED_POLICIES))}, "
                                  f"not {missed!r}")
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace < math.inf:
            raise InvalidSchedule(f"{what}: grace must be a number of seconds >= 0, not {grace!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidSchedule(f"{what}: priority must be an integer, not {priority!r}")
        if role is not None and role not in STARTED_ROLES:
            raise InvalidSchedule(f"{what}: role must be one of {', '.join(map(repr, STARTED_ROLES))} "
                                  f"or None, not {role!r}")
        timetable = Timetable.parse(cron, timezone, what=what)
        fixed = dict(kwargs or {})
        if tick_arg is not None:
            if tick_arg not in workflow.param_types:
                raise InvalidSchedule(f"{what}: workflow {workflow.name!r} has no parameter {tick_arg!r} "
                                      f"for tick_arg")
            if tick_arg in fixed:
                raise InvalidSchedule(f"{what}: {tick_arg!r} is the tick argument; do not give it in kwargs")
        try:
            raw = values.encode(fixed)
        except Exception as exc:  # the codec's refusal (NaN, an unknown type, ...)
            raise InvalidSchedule(f"{what}: kwargs cannot be stored: {exc}") from None
        schedule = cls(label, tenant, workflow, timetable, raw, tick_arg, missed, float(grace), queue,
                       priority, role)
        try:  # as a worker will convert them, with a tick as it will pass it
            schedule.inputs(datetime.now(UTC).timestamp())
        except Exception as exc:  # TypeError from binding, PayloadError from converting
            raise InvalidSchedule(f"{what}: arguments do not fit workflow {workflow.name!r}: {exc}") from None
        return schedule

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.name)

    def spec(self) -> ScheduleSpec:
        """What the store records about this schedule."""
        return ScheduleSpec(self.tenant, self.name, self.workflow.name, self.timetable.cron,
                            self.timetable.timezone, self.missed, self.grace, self.started_role)

    def run_id(self, tick: float) -> str:
        return tick_run_id(self.tenant, self.name, tick)

    def inputs(self, tick: float) -> dict[str, Any]:
        """The arguments of ``tick``'s run, bound and converted to the
        workflow's annotations (``TypeError`` / ``PayloadError`` if they do
        not fit)."""
        arguments: dict[str, Any] = values.decode(self.arguments, dict[str, Any], what="schedule kwargs")
        if self.tick_arg is not None:
            arguments[self.tick_arg] = datetime.fromtimestamp(tick, UTC)
        bound = self.workflow.bind((), arguments)
        return self.workflow.convert(values.decode(values.encode(bound), what="the input"))

    def new_run(self, tick: float, wrap: Any) -> NewRun:
        """The run of ``tick``; ``wrap`` turns encoded input into a stored
        payload (``PayloadCodec.wrap``)."""
        raw = values.encode(self.inputs(tick))
        started_by: dict[str, Any] = {"actor": f"schedule:{self.name}", "auth": "schedule",
                                      "tenant": self.tenant}
        if self.started_role is not None:
            started_by["role"] = self.started_role
        return NewRun(run_id=self.run_id(tick), workflow=self.workflow.name,
                      workflow_version=self.workflow.version, tenant=self.tenant, thread_id=None,
                      input=wrap(raw), queue=self.queue, priority=self.priority, budget=None,
                      started_by=started_by, started_role=self.started_role)

    def due(self, state: ScheduleState, now: float) -> Due:
        """Which ticks to fire at ``now`` given the stored ``state`` (see the
        module doc for the policy)."""
        return due(self.timetable, state.after, now, self.missed, self.grace)


def due(timetable: Timetable, after: float, now: float, missed: str, grace: float) -> Due:
    """Ticks in (``after``, ``now``]: those at most ``grace`` old fire; the
    older ones (missed) follow ``missed``. Pure, for the unit tests."""
    if now <= after:
        return Due((), None, 0)
    cutoff = now - grace
    latest_missed = timetable.last_at_or_before(cutoff) if cutoff > after else None
    if latest_missed is not None and latest_missed <= after:
        latest_missed = None
    if latest_missed is None:
        return Due(tuple(timetable.ticks(after, now, MAX_TICKS_PER_PASS)), None, 0)
    if missed == "all":
        ticks = timetable.ticks(after, now, MAX_TICKS_PER_PASS)
        return Due(tuple(ticks), None, sum(1 for t in ticks if t <= cutoff))
    count = _count(timetable, after, latest_missed)
    on_time = timetable.ticks(latest_missed, now, MAX_TICKS_PER_PASS)
    if missed == "once":
        return Due((latest_missed, *on_time[: MAX_TICKS_PER_PASS - 1]), None, count)
    return Due(tuple(on_time), latest_missed, count)


def _count(timetable: Timetable, after: float, until: float, cap: int = 1000) -> int:
    """How many ticks lie in (``after``, ``until``] (for the log; at most ``cap``)."""
    return len(timetable.ticks(after, until, cap))
