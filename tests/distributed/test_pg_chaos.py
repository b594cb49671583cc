"""Chaos on PostgreSQL: 4 workers x 500 runs x 10 bank transfers, random SIGKILLs, server restarts.

Four worker processes (``tests.distributed.run_worker``, 4 executions each,
2 s leases) execute 500 runs of ten ``write``-tool steps each; every step moves
money at the fake bank (a separate process with its own database), keyed by the
call's operation id, with an amount unique to its (run, step). Meanwhile:

* a seeded RNG SIGKILLs a random worker every 0.05-0.5 s (of a quiet
  machine: times how slow the machine is, ``MachineSpeed``) and starts it again,
  alternately under the same worker id (its runs are reclaimed at once) and a
  new one (its runs wait for their leases to expire, then are taken over);
* the PostgreSQL server itself is restarted twice while runs are in flight:
  once with a fast shutdown, once with an immediate one (a crash: recovery
  from the WAL). Running workers must live through it: their executions
  abandon on connection errors, the pools reconnect, and the fence keeps any
  stale write out. After each restart no worker is killed until every worker
  that lived through it has recorded a step again.

Afterwards every run completed with the right total; the bank holds exactly
5000 transfers, no key twice, each key the operation id of an ``op.intent``
entry, each (run, step) paid exactly once with its own amount; each recorded
step holds the very transfer the bank has; no recorded step ran again; every
tool body ran behind a durable intent of its own lease; every history passes
the harness's fencing audit (see ``cluster.verify_runs``).

``CAIRN_DIST_SEED`` replays a kill schedule (the seed is printed, and named in
failures). ``CAIRN_DIST_CHAOS_RUNS`` runs a smaller size for quick local
iterations; the default is the full size.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from tests.acceptance.harness import WorkerProcess, wait_until
from tests.distributed.bank_app import WORKFLOW
from tests.distributed.cluster import DistCluster, Outage, PgServer, verify_runs, worked_after_giving_up
from tests.timing import STALL, StallWatch, slowness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = int(os.environ.get("CAIRN_DIST_SEED", "918273645"))
RUNS = int(os.environ.get("CAIRN_DIST_CHAOS_RUNS", "500"))
STEPS = 10
WORKERS = 4
CONCURRENCY = 4
LEASE = 2.0
#: seconds between two kills (uniform); the whole size takes well under a minute without kills.
#: Alone on this machine: 267 kills (94 of a worker holding runs) in a 97 s chaos phase; at
#: 0.02-0.3 s it was 554 kills (121) in 131 s, most of it spent starting killed workers again
KILL_PAUSE = (0.05, 0.5)
#: fewer kills than this would not be much of a chaos test
MIN_KILLS = 20
#: restart the server once this share of the runs completed, with this shutdown mode
RESTARTS = ((1 / 3, "fast"), (2 / 3, "immediate"))
#: how long every worker that lived through a restart gets to record a step again
RECOVERY_TIMEOUT = 60.0
#: the chaos phase fails once no run completed for this long (a hang, not a slow machine)
STALL_SECONDS = STALL
#: statuses a run may have in this test
LIVE = frozenset({"pending", "running", "suspended", "completed"})


@dataclass
class Kill:
    at: float
    victim: str
    pid: int
    respawned_as: str
    completed: int
    #: runs the victim held (owner, running) when it was killed
    held: int

    @property
    def same_id(self) -> bool:
        return self.victim == self.respawned_as


@dataclass
class Restart:
    outage: Outage
    completed: int
    #: seconds from the server accepting connections until every surviving worker recorded a step
    recovered_in: float
    #: how many of the workers that lived through it recorded steps afterwards
    recorded_again: int


class MachineSpeed:
    """How slow the machine is now, from the worker processes' start-ups: the
    wall time from spawn to the ``launching`` line over the CPU time the
    process had used by then (``tests.timing.slowness``), of the latest
    worker that launched."""

    LINE = re.compile(r"^(\d+\.\d+) pid=\d+ run_worker INFO worker \S+ launching \(cpu ([\d.]+)s\)", re.M)

    def __init__(self, workers: list[WorkerProcess]) -> None:
        self.pending = list(workers)
        self.latest: float | None = None
        self.seen: list[float] = []

    def watch(self, worker: WorkerProcess) -> None:
        self.pending.append(worker)

    def measured(self) -> bool:
        for worker in list(self.pending):
            match = self.LINE.search(worker.log_text())
            if match is not None:
                self.pending.remove(worker)
                self.latest = slowness(float(match[1]) - worker.spawned_at, float(match[2]))
                self.seen.append(self.latest)
            elif not worker.alive():  # killed before it launched: nothing to learn from it
                self.pending.remove(worker)
        return self.latest is not None

    def factor(self) -> float:
        self.measured()
        return self.latest or 1.0


def steps_recorded_since(dist: DistCluster, worker_id: str, since: float) -> int:
    rows = dist.observer.query(
        "SELECT count(*) FROM history WHERE worker = %s AND at > %s AND event = 'step.completed'",
        (worker_id, since))
    return int(rows[0][0]) if rows else 0


def test_kills_and_server_restarts_never_repeat_a_recorded_step(
    pg_server: PgServer, dist: DistCluster
) -> None:
    rng = random.Random(SEED)
    context = f"(seed {SEED}; replay with CAIRN_DIST_SEED={SEED})"
    print(f"\nchaos on PostgreSQL: seed {SEED}, {WORKERS} workers x {CONCURRENCY}, {RUNS} runs x {STEPS} "
          f"steps, lease {LEASE:g}s")
    began = time.monotonic()
    app = dist.app(lease_seconds=LEASE)
    runs = {app.start(WORKFLOW, run_index=i, steps=STEPS, run_id=f"chaos-{i:04d}").run_id: i
            for i in range(RUNS)}
    dist.close_app(app)
    created_in = time.monotonic() - began

    slots: list[WorkerProcess] = [dist.spawn(f"w{n}", concurrency=CONCURRENCY, lease=LEASE)
                                  for n in range(WORKERS)]
    started = time.monotonic()
    kills: list[Kill] = []
    restarts: list[Restart] = []
    plan = list(RESTARTS)
    # The pauses between kills are in the machine's own time: KILL_PAUSE times how slow the last
    # worker process to launch found the machine. In wall clock alone the schedule outpaces the
    # respawns on a loaded machine (starting a Python process takes ten times as long there, the
    # pause does not) and no run completes ever; in the machine's time the chaos is the same share
    # of the work on any machine. The first kill waits for the first measurement.
    slow = MachineSpeed(slots)
    next_kill: float | None = None
    stalled = StallWatch("a run to complete under chaos", STALL_SECONDS)

    def check_workers() -> None:
        for worker in slots:
            assert worker.alive(), (f"worker {worker.worker_id} (pid {worker.pid}) died without being killed "
                                    f"{context}:\n{worker.log_tail(40)}")

    while True:
        elapsed = time.monotonic() - started
        counts = dist.observer.statuses()
        stalled.check(counts["completed"] if counts else stalled.last,
                      f"{counts}, {len(kills)} kills {context}")
        check_workers()
        if counts is None:  # a connection the restart broke: the observer reconnects next time
            time.sleep(0.1)
            continue
        if not set(counts) <= LIVE:
            odd = dist.observer.query("SELECT run_id, status, error FROM runs WHERE status <> ALL(%s)",
                                      (sorted(LIVE),))
            raise AssertionError(f"runs in unexpected states: {counts}: {odd} {context}")
        completed = counts["completed"]
        if completed == RUNS:
            break
        if plan and completed >= plan[0][0] * RUNS:
            _, mode = plan.pop(0)
            survivors = list(slots)
            dist.observer.close()
            outage = pg_server.restart(mode)
            assert outage.up is not None
            up = outage.up

            def all_recorded_again(since: float = up, workers: list[WorkerProcess] = survivors) -> bool:
                check_workers()
                if all(steps_recorded_since(dist, w.worker_id, since) > 0 for w in workers):
                    return True
                counts = dist.observer.statuses()  # (or nothing was left for some of them to do)
                return counts is not None and counts["completed"] == RUNS

            def waiting_for(mode: str = mode) -> str:
                workers = dist.describe_workers()
                return f"every worker to record a step after the {mode} restart {context}\n{workers}"

            wait_until(all_recorded_again, RECOVERY_TIMEOUT, waiting_for, interval=0.1)
            recovered_in = time.time() - up
            again = [w.worker_id for w in survivors if steps_recorded_since(dist, w.worker_id, up) > 0]
            assert again, f"no worker recorded anything after the {mode} restart {context}"
            restarts.append(Restart(outage, completed, recovered_in, len(again)))
            print(f"  restart {len(restarts)} at {completed}/{RUNS} runs completed ({elapsed:.1f}s): "
                  f"{outage}; {len(again)} of the {len(survivors)} workers that lived through it recorded "
                  f"steps again within {recovered_in:.2f}s")
            next_kill = time.monotonic() + rng.uniform(*KILL_PAUSE) * slow.factor()
            stalled.touch()  # the restart's own wait was bounded by its own progress condition
            continue
        if next_kill is None and slow.measured():
            next_kill = time.monotonic() + rng.uniform(*KILL_PAUSE) * slow.factor()
        if next_kill is not None and time.monotonic() >= next_kill:
            slot = rng.randrange(WORKERS)
            victim = slots[slot]
            rows = dist.observer.query("SELECT count(*) FROM runs WHERE owner = %s AND status = 'running'",
                                       (victim.worker_id,))
            victim.kill()
            # alternate: a new id (its runs' leases must expire: takeovers), then the same id (reclaimed)
            worker_id = f"w{slot}-k{len(kills)}" if len(kills) % 2 == 0 else victim.worker_id
            kills.append(Kill(time.time(), victim.worker_id, victim.pid, worker_id, completed,
                              int(rows[0][0]) if rows else -1))
            slots[slot] = dist.spawn(worker_id, concurrency=CONCURRENCY, lease=LEASE)
            slow.watch(slots[slot])
            # Kills keep pace with progress: while fewer than MIN_KILLS (and a margin) are spread over
            # the share of runs completed so far, the next comes after the shortest pause, so a machine
            # that finishes runs faster than the paced schedule kills still meets the minimum.
            behind = len(kills) < 1.5 * MIN_KILLS * max(completed, 1) / RUNS
            pause = KILL_PAUSE[0] if behind else rng.uniform(*KILL_PAUSE)
            next_kill = time.monotonic() + pause * slow.factor()
        time.sleep(0.1)
    chaos_seconds = time.monotonic() - started
    dist.terminate_gracefully(slots)

    assert len(restarts) == len(RESTARTS), f"only {len(restarts)} server restarts happened {context}"
    assert all(r.completed < RUNS for r in restarts)
    assert len(kills) >= MIN_KILLS, f"only {len(kills)} kills: the run was too short to be chaos {context}"
    app = dist.app()
    transfers = dist.bank.client().transfers()
    verdict = verify_runs(app, transfers, dist.effects(), runs, STEPS, context=context)
    ended = dist.outcomes()
    problems = worked_after_giving_up(ended, dist.effects())
    assert problems == [], f"work done after giving up {context}:\n" + "\n".join(problems[:20])
    statuses = Counter(o.status for o in ended)
    same = sum(1 for k in kills if k.same_id)
    total = time.monotonic() - began
    print(f"  {RUNS} runs created in {created_in:.1f}s; chaos phase {chaos_seconds:.1f}s; whole test body "
          f"{total:.1f}s\n  {len(kills)} SIGKILLs ({same} restarted under the same id, "
          f"{len(kills) - same} under a new one; {sum(1 for k in kills if k.held > 0)} of them killed a "
          f"worker holding runs, "
          f"{sum(max(k.held, 0) for k in kills)} runs in all), {len(restarts)} server restarts "
          f"({', '.join(f'{r.outage.mode} {r.outage.seconds:.2f}s' for r in restarts)}), {len(dist.workers)} "
          f"worker processes in all\n  claims ended (as logged by workers that lived to tell): "
          f"{dict(statuses)}\n  the machine was {min(slow.seen):.1f}-{max(slow.seen):.1f}x slower than alone "
          f"(worker start-ups: wall over CPU time), the kill pauses scaled by it\n"
          f"  {verdict}")
