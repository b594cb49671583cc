"""The scheduler: fires the app's schedules from inside ``cairn worker``.

Every worker runs one (a thread, no extra process), and any number of them
may fire the same schedules at once, on SQLite or PostgreSQL: exactly-once
is the store's business, not an election. Each pass reads the schedules'
stored state, asks ``engine.schedules.due`` which ticks are due by the
store's clock (the database server's on PostgreSQL, so workers on machines
whose clocks disagree still agree on what is due), and fires each tick with
``Store.fire_schedule``: one transaction that creates the tick's run (its id
derived from the schedule and the tick) and moves the schedule's
``last_tick`` up to the tick, or does nothing if another worker got there
first. A worker killed at any instant leaves either both or neither, and
the next pass of any worker carries on from ``last_tick``.

Between passes the thread sleeps until the next tick of any schedule (at
most ``max_sleep``), so every live worker wakes at each tick and the first
to commit fires it: no tick is missed while one worker lives, and none fires
twice however many do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from cairn.engine.runtime import Runtime
from cairn.engine.schedules import MAX_TICKS_PER_PASS, Schedule, tick_text
from cairn.errors import StoreError
from cairn.sideloop import SideLoop
from cairn.store.oplog import acting
from cairn.store.schedules import Fired, ScheduleState

log = logging.getLogger("cairn.scheduler")

#: How long a schedule whose registration the store refused waits before
#: the next attempt (a tenant-scoped worker may not act for its tenant).
REGISTER_RETRY_SECONDS = 60.0


class Scheduler(SideLoop):
    """Fires ``schedules`` on ``runtime``'s store; ``run_pass`` does one
    pass (tests call it directly with a store on a fake clock), ``start`` runs
    passes on a thread until ``stop``."""

    def __init__(self, runtime: Runtime, schedules: Sequence[Schedule], *, worker_id: str = "",
                 max_sleep: float = 5.0) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.schedules = {schedule.key: schedule for schedule in schedules}
        self.worker_id = worker_id
        self.max_sleep = max_sleep
        #: runs this scheduler created (other workers' are not counted)
        self.created = 0
        self._registered: set[tuple[str, str]] = set()
        self._retry_at: dict[tuple[str, str], float] = {}
        super().__init__(f"scheduler-{worker_id}" if worker_id else "scheduler", log, max_wait=max_sleep)

    # -- one pass -------------------------------------------------------------------

    def register(self) -> None:
        """Record every declared schedule not yet registered by this
        scheduler. One the store refuses (a role that may not act for its
        tenant, a store that is down) is logged and tried again later; the
        others go on."""
        now = time.monotonic()
        for key, schedule in self.schedules.items():
            if key in self._registered or self._retry_at.get(key, 0.0) > now:
                continue
            try:
                spec = schedule.spec()
                with acting(self.store, f"worker:{self.worker_id or 'scheduler'}", spec.tenant, "schedule",
                            spec.name, "schedule.register", {"workflow": spec.workflow, "cron": spec.cron,
                                                             "timezone": spec.timezone, "missed": spec.missed,
                                                             "grace": spec.grace}):
                    self.store.register_schedule(spec)
            except StoreError as exc:
                self._retry_at[key] = now + REGISTER_RETRY_SECONDS
                log.warning("schedule %s of tenant %s cannot be registered (%s); this worker will not "
                            "fire it (again in %.0fs)", schedule.name, schedule.tenant, exc,
                            REGISTER_RETRY_SECONDS)
                continue
            self._registered.add(key)
            self._retry_at.pop(key, None)

    def run_pass(self) -> float | None:
        """Fire every tick due now; return when (store clock) the next one is
        due, ``None`` if there is nothing to fire."""
        self.register()
        if not self._registered:
            return None
        states = {(state.tenant, state.name): state for state in self.store.list_schedules()}
        now = self.store.clock()
        upcoming: list[float] = []
        for key in sorted(self._registered):
            schedule = self.schedules[key]
            state = states.get(key)
            if state is None:  # the row is gone (deleted by hand): register it again
                self._registered.discard(key)
                upcoming.append(now)
                continue
            try:
                behind = self._fire_due(schedule, state, now)
                after = max(now, state.after)
                upcoming.append(now if behind else schedule.timetable.next_after(after))
            except StoreError:
                raise
            except StopIteration:  # no tick in the next 50 years
                continue
            except Exception:  # a bug, never a reason to stop firing the other schedules
                log.exception("schedule %s of tenant %s: firing failed", schedule.name, schedule.tenant)
        return min(upcoming, default=None)

    def _fire_due(self, schedule: Schedule, state: ScheduleState, now: float) -> bool:
        """Fire what is due; whether more is due at once (a capped pass, a
        row that vanished)."""
        due = schedule.due(state, now)
        if due.missed:
            what = {"skip": "passed over", "once": "one catch-up run for them",
                    "all": "a run for each"}[schedule.missed]
            log.info("schedule %s of tenant %s: %d tick(s) missed while no worker ran; missed=%s: %s",
                     schedule.name, schedule.tenant, due.missed, schedule.missed, what)
        if due.pass_over is not None:
            self.store.fire_schedule(schedule.tenant, schedule.name, due.pass_over, None)
        for tick in due.fire:
            run = schedule.new_run(tick, self.runtime.payloads.wrap)
            fired = self.store.fire_schedule(schedule.tenant, schedule.name, tick, run)
            if fired is Fired.CREATED:
                self.created += 1
                log.info("schedule %s of tenant %s: tick %s started run %s", schedule.name, schedule.tenant,
                         tick_text(tick), run.run_id)
            elif fired is Fired.TAKEN:
                log.warning("schedule %s of tenant %s: tick %s has no run: its id %s is taken by a run this "
                            "store cannot read", schedule.name, schedule.tenant, tick_text(tick), run.run_id)
            elif fired is Fired.MISSING:
                self._registered.discard(schedule.key)
                return True
        return len(due.fire) >= MAX_TICKS_PER_PASS  # capped: the rest at once

    # -- the thread -------------------------------------------------------------------

    def cycle(self) -> float:
        next_tick = self.run_pass()
        return self.max_sleep if next_tick is None else next_tick - self.store.clock()

    def start(self) -> None:
        if self.schedules:
            super().start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop after the pass in progress (a tick being fired is committed or not at all)."""
        super().stop(timeout)
