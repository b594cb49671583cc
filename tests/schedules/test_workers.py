"""Schedules fired by real worker processes, SIGKILLed and restarted, on
SQLite and PostgreSQL (the crash harness of ``tests/acceptance/harness.py``).

Three workers run ``tests.schedules.sched_app`` (two schedules every second,
``missed="skip"`` and ``missed="once"``, grace 2 s). Two of them carry a
fault plan that SIGKILLs them inside the firing transaction
(``store.fire_schedule.before_commit``) or right after its commit
(``...after_commit``); the test kills and restarts the others at random,
always leaving one running worker. Then every worker is killed for longer
than the grace, and one comes back. What must hold:

* exactly one run per tick: run ids are derived from the tick, and each
  run's input carries the tick it was made for;
* no tick missed while one worker lived: the ticks of each schedule from
  its first to the last before the outage are every second, without a gap;
* after the outage, the restarted worker's first pass fires both schedules
  at one "now": ``skip`` starts runs for the ticks within the grace only
  (after a gap of passed-over ticks), ``once`` for the same ticks plus exactly
  one catch-up run for the latest missed tick; both carry on every second.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

import cairn
from cairn.store.records import RunFilter, RunRecord, RunStatus
from tests.acceptance.harness import WorkerPool, WorkerProcess, wait_until
from tests.backends import StoreBackend
from tests.schedules.sched_app import DB_ENV, GRACE, SCHEDULES, TENANT, build_app
from tests.timing import StallWatch

pytestmark = pytest.mark.slow


class SchedulePool(WorkerPool):
    """Worker processes of ``tests.schedules.sched_app``."""

    def app(self) -> cairn.App:
        return self._keep(build_app(self.db_url))

    def spawn(self, worker_id: str, faults: str | None = None) -> WorkerProcess:
        env = {DB_ENV: self.backend.worker_url(worker_id)}
        if faults:
            env["CAIRN_FAULTS"] = faults
        worker = self._launch("tests.schedules.run_worker", worker_id, [], env)
        worker.armed = bool(faults)  # type: ignore[attr-defined]
        return worker


@pytest.fixture
def pool(tmp_path: Path, backend: StoreBackend) -> Iterator[SchedulePool]:
    pool = SchedulePool(tmp_path, backend)
    try:
        yield pool
    finally:
        pool.cleanup()


def ready(worker: WorkerProcess) -> bool:
    return worker.alive() and "starting" in worker.log_text()


def tick_of(run: RunRecord, name: str) -> float:
    text = run.run_id.removeprefix(f"schedule:{TENANT}:{name}:")
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def runs_by_tick(app: cairn.App, name: str) -> dict[float, RunRecord]:
    runs = [r for r in app.store.list_runs(RunFilter(None, TENANT, "beat", None, None, 100_000))
            if r.run_id.startswith(f"schedule:{TENANT}:{name}:")]
    by_tick = {tick_of(r, name): r for r in runs}
    assert len(by_tick) == len(runs)
    return by_tick


def by_tick_created(app: cairn.App, name: str, tick: float) -> float:
    return runs_by_tick(app, name)[tick].created_at


#: seconds of random kills at least (the loop goes on until the fault plans fired)
CHAOS = 8.0
#: ...and at most: past it the loop is a livelock, whatever progresses
CHAOS_CEILING = 600.0


def test_three_workers_killed_and_restarted_start_one_run_per_tick(pool: SchedulePool) -> None:
    app = pool.app()
    rng = random.Random(11)
    workers = [pool.spawn("w1"), pool.spawn("w2", "store.fire_schedule.before_commit@3"),
               pool.spawn("w3", "store.fire_schedule.after_commit@4")]
    wait_until(lambda: any(ready(w) for w in workers), 60, "a worker to start")
    wait_until(lambda: all(runs_by_tick(app, name) for name in SCHEDULES), 30, "the first ticks")
    restarts = 0
    armed = [w for w in workers if getattr(w, "armed", False)]

    def plans_fired() -> bool:
        return all(w.popen.poll() == -signal.SIGKILL for w in armed)

    # kill for CHAOS seconds, and on until both fault plans fired (at a worker's 3rd and 4th
    # firing: on a loaded machine the workers may need longer than CHAOS to get there); a hang
    # fails once no schedule fired for STALL seconds, not after a guess at the machine's speed
    watch = StallWatch("the fault plans to fire", ceiling=CHAOS_CEILING)
    began = time.monotonic()
    while time.monotonic() - began < CHAOS or not plans_fired():
        watch.check(sum(len(runs_by_tick(app, name)) for name in SCHEDULES), pool.describe_workers)
        time.sleep(0.6)
        for i, worker in enumerate(workers):
            if not worker.alive():  # killed by us, or by its fault plan inside a firing
                worker.ended_at = time.time()
                workers[i] = pool.spawn(f"{worker.worker_id.split('.')[0]}.{restarts}")
                restarts += 1
        safe = [w for w in workers if ready(w) and not getattr(w, "armed", False)]
        if len(safe) >= 2:
            rng.choice(safe).kill()
    faulted = [w for w in pool.workers if getattr(w, "armed", False)]
    assert all(w.popen.poll() == -signal.SIGKILL for w in faulted), "the fault plans did not fire"

    # every worker down for longer than the grace, then one comes back
    for worker in workers:
        if worker.alive():
            worker.kill()
    down_at = time.time()
    before = {name: max(runs_by_tick(app, name)) for name in SCHEDULES}
    time.sleep(GRACE + 3.0)
    back = pool.spawn("w-back")
    horizon = down_at + GRACE + 5.0
    wait_until(lambda: all(max(runs_by_tick(app, name)) >= horizon for name in SCHEDULES),
               60, "ticks after the outage")
    wait_until(lambda: all(r.status is RunStatus.COMPLETED for name in SCHEDULES
                           for t, r in runs_by_tick(app, name).items() if t <= horizon),
               30, "every run up to then to complete")
    back.send(signal.SIGTERM)
    assert back.wait_exit(30) == 0

    after: dict[str, list[float]] = {}
    for name in SCHEDULES:
        by_tick = runs_by_tick(app, name)
        ticks = sorted(by_tick)
        up_to = [t for t in ticks if t <= before[name]]
        assert up_to == [float(t) for t in range(int(up_to[0]), int(before[name]) + 1)], \
            f"{name}: a tick was missed while a worker lived"
        after[name] = [t for t in ticks if t > before[name]]
        assert after[name] == [float(t) for t in range(int(after[name][0]), int(after[name][-1]) + 1)], \
            f"{name}: a gap after the restart: {after[name]}"
        for tick, run in by_tick.items():  # each run was made for its own tick
            arguments = json.loads(app.runtime.payloads.raw(run.input, what="input"))
            assert arguments == {"label": name, "at": datetime.fromtimestamp(tick, UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ")}
    # The restarted worker's first pass fired both schedules at one "now": "skip" started runs
    # for the ticks within the grace only, after a gap of passed-over ticks; "once" the same ticks
    # plus exactly one catch-up run, for the latest missed tick (the one just before them).
    skip, once = after["beat-skip"], after["beat-once"]
    assert skip[0] - before["beat-skip"] >= 3, f"the outage left no missed tick: {before}, {skip[:3]}"
    assert once[0] == skip[0] - 1, f"once: no single catch-up run before {skip[0]}: {once[:4]}"
    end = min(skip[-1], once[-1])
    assert [t for t in once if t <= end] == [once[0], *[t for t in skip if t <= end]]
    assert by_tick_created(app, "beat-once", once[0]) >= once[0] + GRACE  # it fired late, on purpose
