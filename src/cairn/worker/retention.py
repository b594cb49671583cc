"""The retention controller (issue 26 part 3): enforces the stored retention
policies (``cairn.store.retention``) on a side loop of ``cairn worker``, or
once (``cairn retention run``).

One controller at a time: a pass first takes the store's retention lease
(``Store.take_retention_lease``) and renews it before every batch; every
deleting transaction checks that lease (the fence) first, so a controller
that lost it, paused past its expiry or fenced out by a takeover, deletes
nothing more (``RetentionFenced``). A pass is a sequence of batches, each
one transaction that deletes whole units (a run tree, an entry's body, a
message, an item with its outbox rows and vectors), so a controller
SIGKILLed anywhere leaves every unit deleted or intact, and the next pass
(any worker's, once the lease expires) finds what is left and finishes it.

The dry run (``plan``) is the same selection without the deletions: it
lists what a pass at the same instant deletes, class by class.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from cairn import faults
from cairn.errors import RetentionFenced
from cairn.faults import fault_point
from cairn.sideloop import SideLoop
from cairn.store import retention as rt
from cairn.store.contract import Store
from cairn.store.retention import DataClass, Policy
from cairn.store.retentionsql import Fence, Key

log = logging.getLogger("cairn.retention")

#: the order a pass goes in: bodies and memory, the records of runs deleted
#: before, then whole runs (the record of a run deleted in this pass is due
#: at the next pass at the earliest: a plan lists only records that exist)
ORDER = (DataClass.MODEL_BODIES, DataClass.ARTIFACTS, DataClass.THREAD_MEMORY, DataClass.KV_MEMORY,
         DataClass.SEMANTIC_MEMORY, DataClass.AUDIT, DataClass.HISTORY, DataClass.ARCHIVES)

#: the actor recorded on what the controller deletes (``api.actors``: the system)
ACTOR = "system:retention"


@dataclass(slots=True)
class Plan:
    """What a pass deletes (``plan``) or deleted (``run``), class by class:
    the keys of the units (a run id; a run and seq whose body expires; a
    tenant, thread and message index; a tenant, namespace, key and time)."""

    at: float
    policies: list[Policy]
    units: dict[DataClass, list[Key]] = field(default_factory=dict)
    #: a pass cut short: it lost its lease (``None``: complete)
    fenced: str | None = None

    def count(self, cls: DataClass) -> int:
        return len(self.units.get(cls, ()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "policies": [{"tenant": p.tenant, "workflow": p.workflow, "class": p.data_class.value,
                          "keep": rt.format_keep(p.keep), "keep_seconds": p.keep, "updated_at": p.updated_at,
                          "updated_by": p.updated_by} for p in self.policies],
            "classes": {cls.value: {"count": len(keys), "units": [list(k) for k in keys]}
                        for cls, keys in self.units.items()},
            "fenced": self.fenced,
        }


class Controller:
    """Enforces ``store``'s retention policies as ``holder`` (one lease)."""

    def __init__(self, store: Store, holder: str, *, lease_seconds: float = 60.0, batch: int = 500,
                 actor: str = ACTOR) -> None:
        if batch < 1:
            raise ValueError(f"a batch holds at least 1 unit, not {batch}")
        self.store = store
        self.holder = holder
        self.lease_seconds = lease_seconds
        self.batch = batch
        self.actor = actor
        self.epoch: int | None = None

    def plan(self) -> Plan:
        """What a pass now would delete (changes nothing, takes no lease)."""
        store = self.store
        now = store.clock()
        policies = store.retention_policies()
        plan = Plan(now, policies)
        for cls in ORDER:
            cut = rt.cutoffs(policies, cls, now)
            if cls is DataClass.HISTORY:
                plan.units[cls] = [(run_id,) for run_id in store.prunable_runs(cut, None, sys.maxsize)]
            else:
                plan.units[cls] = store.retention_due(cut)
        # a model call stored by reference is due as a body and as an artifact:
        # the pass expires it once, as a body (the class before)
        bodies = set(plan.units[DataClass.MODEL_BODIES])
        plan.units[DataClass.ARTIFACTS] = [k for k in plan.units[DataClass.ARTIFACTS] if k not in bodies]
        return plan

    def run(self) -> Plan | None:
        """One pass: take the lease, delete what every class's policy makes
        due, batch by batch. ``None``: another controller holds the lease.
        A pass that loses its lease midway stops (``Plan.fenced`` says why)."""
        store = self.store
        policies = store.retention_policies()
        if not policies:
            return Plan(store.clock(), policies)  # nothing to enforce: not even the lease is written
        if not self._renew():
            return None
        now = store.clock()
        done = Plan(now, policies)
        try:
            for cls in ORDER:
                done.units[cls] = self._enforce(rt.cutoffs(policies, cls, now))
        except RetentionFenced as exc:
            done.fenced = str(exc)
            log.warning("retention: %s", exc)
        gone = {cls.value: len(keys) for cls, keys in done.units.items() if keys}
        if gone:
            log.info("retention pass by %s: %s", self.holder, gone)
        return done

    def _enforce(self, cutoffs: rt.Cutoffs) -> list[Key]:
        if cutoffs.cls is DataClass.HISTORY:
            return self._prune(cutoffs)
        gone: list[Key] = []
        due = self.store.retention_due(cutoffs)
        for start in range(0, len(due), self.batch):
            fence = self._fence()
            gone += self.store.retention_delete(cutoffs, due[start:start + self.batch], fence)
            if faults.ARMED:
                fault_point("retention.after_batch")
        return gone

    def _prune(self, cutoffs: rt.Cutoffs) -> list[Key]:
        """Run history through the one run-deletion path (``prune_runs``)."""
        gone: list[str] = []
        while True:
            fence = self._fence()
            # called even with nothing to delete: it also collects the artifacts
            # nothing references any more (those of bodies expired above)
            if not self.store.prune_runs(cutoffs, None, self.batch, fence=fence, actor=self.actor, into=gone):
                return [(run_id,) for run_id in gone]
            if faults.ARMED:
                fault_point("retention.after_batch")

    def _renew(self) -> bool:
        epoch = self.store.take_retention_lease(self.holder, self.lease_seconds, self.epoch)
        self.epoch = epoch
        return epoch is not None

    def _fence(self) -> Fence:
        """The lease, renewed before a batch (``RetentionFenced`` if it is gone)."""
        if not self._renew():
            raise RetentionFenced(f"the retention controller {self.holder} lost its lease to another")
        assert self.epoch is not None
        return (self.holder, self.epoch)


class RetentionLoop(SideLoop):
    """A controller pass every ``interval`` seconds on a thread of ``cairn worker``.
    Every worker runs one; the lease lets one of them delete at a time."""

    def __init__(self, store: Store, holder: str, *, interval: float = 300.0, batch: int = 500) -> None:
        super().__init__(f"retention-{holder}", log, max_wait=interval)
        self.interval = interval
        self.controller = Controller(store, holder, lease_seconds=max(60.0, 2 * interval), batch=batch)

    def cycle(self) -> float:
        self.controller.run()
        return self.interval


__all__ = ["ACTOR", "ORDER", "Controller", "Plan", "RetentionLoop"]
