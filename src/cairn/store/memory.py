"""The in-process backend: every run and history in Python dictionaries.

Why it exists: unit tests and quick experiments need a store with the exact
semantics of the durable backends but none of their setup, and the contract
suite (``tests/store/``) needs a second implementation so that it pins the
*protocol* rather than one backend's accidents. It is durable only for the
life of the process, whatever ``durability`` says; the attribute is kept so
that code reading it behaves the same on every backend.

Design notes:

* One ``RLock`` around every public method makes each call a single atomic
  transaction, the memory analogue of ``BEGIN IMMEDIATE`` ... ``COMMIT``. Every
  method validates everything that can fail *before* it mutates anything, so a
  raised exception always means "nothing changed".
* Like the SQLite backend, each run keeps a ``runnable_at`` time (``None``
  while it cannot be claimed): pending runs, due timers and expired leases are
  all "``runnable_at <= now``", which keeps claiming one rule.
* Records are frozen, but their ``error``, ``budget`` and ``detail`` dicts
  are not. They are copied through a JSON round trip on the way in and out,
  so callers can never mutate stored state, and a value the SQLite backend
  could not store (it keeps these dicts as JSON) fails here too instead of
  only in production.
* ``durability`` cannot be honoured (nothing here outlives the process), so
  the effect barrier (``append(..., barrier=True)``) is a plain append.
* Tenancy needs no column here: a run's history lives inside its run entry,
  so every entry is stored with (and only reachable through) its run's
  tenant. Artifacts are shared by every tenant, as on the other backends.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from cairn.errors import InvalidRunState, LeaseLost, PayloadError, RunNotFound, StoreError
from cairn.store import admission
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, check_prune_limit, choose_trees, prune_statuses
from cairn.store.records import (
    Claim,
    Durability,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunFilter,
    RunRecord,
    RunStatus,
)
from cairn.store.rows import created_detail as _created_detail

_T = TypeVar("_T")

_FINISH_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED)
_RETRYABLE = (RunStatus.FAILED, RunStatus.QUARANTINED)
_PARKED = (RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION)
_REVIVABLE = (RunStatus.KILLED, RunStatus.HALTED)


@dataclass(slots=True)
class _Run:
    """Everything the store keeps about one run (never handed out as is)."""

    record: RunRecord
    #: When the run may next be claimed; ``None`` while it cannot be.
    runnable_at: float | None
    #: Creation order: breaks ties between runs created at the same clock time.
    order: int
    history: list[HistoryEvent] = field(default_factory=list)

    @property
    def max_seq(self) -> int:
        return self.history[-1].seq if self.history else 0


class MemoryStore:
    """Store contract in process memory (see ``contract.Store``); thread-safe."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        durability: Durability = Durability.PROCESS,
    ) -> None:
        self.clock = clock
        self.durability = durability
        self._lock = threading.RLock()
        self._runs: dict[str, _Run] = {}
        #: parent run id -> child run ids, for the cancel cascade.
        self._children: dict[str, list[str]] = {}
        self._artifacts: dict[str, bytes] = {}
        #: artifact ref -> when it was last stored (the store's clock)
        self._touched: dict[str, float] = {}
        #: refs of pruned runs waiting to be collected -> when they were queued
        self._gc: dict[str, float] = {}
        self._order = itertools.count()
        self._closed = False
        #: configured queue limits by name, and their token buckets
        self._queues: dict[str, admission.QueueLimits] = {}
        self._buckets: dict[admission.BucketKey, admission.Bucket] = {}
        self._lane_cursor = admission.LaneCursor()

    def close(self) -> None:
        """Drop everything; later calls raise ``StoreError`` (as on SQLite,
        using a closed store is a bug, not something to paper over)."""
        with self._lock:
            self._closed = True
            self._runs.clear()
            self._children.clear()
            self._artifacts.clear()
            self._touched.clear()
            self._gc.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("store is closed")

    # -- creating and reading runs -------------------------------------------

    def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        with self._lock:
            self._check_open()
            existing = self._runs.get(run.run_id)
            if existing is not None:
                return _copy_record(existing.record), False
            now = self.clock()
            entry = self._insert(run, now, status=RunStatus.PENDING, runnable_at=now)
            self._append_auto(entry, EventType.RUN_CREATED, now, 0, None, _created_detail(run))
            return _copy_record(entry.record), True

    def create_claimed_run(self, run: NewRun, worker: str, lease_seconds: float) -> Claim | None:
        with self._lock:
            self._check_open()
            if run.run_id in self._runs:
                return None
            now = self.clock()
            until = now + lease_seconds
            entry = self._insert(
                run,
                now,
                status=RunStatus.RUNNING,
                runnable_at=until,
                epoch=1,
                owner=worker,
                lease_until=until,
            )
            self._append_auto(entry, EventType.RUN_CREATED, now, 1, None, _created_detail(run))
            self._append_auto(entry, EventType.LEASE_CLAIMED, now, 1, worker, {"lease_until": until})
            self._append_auto(entry, EventType.RUN_STARTED, now, 1, worker, None)
            return self._claim_of(entry)

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            self._check_open()
            entry = self._runs.get(run_id)
            return _copy_record(entry.record) if entry is not None else None

    def list_runs(self, filter: RunFilter) -> list[RunRecord]:
        with self._lock:
            self._check_open()
            matching = [entry for entry in self._runs.values() if _matches(entry.record, filter)]
            matching.sort(key=lambda e: (e.record.created_at, e.order), reverse=True)
            return [_copy_record(e.record) for e in _limited(matching, filter.limit)]

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        with self._lock:
            self._check_open()
            entry = self._runs.get(run_id)
            if entry is None:
                return []
            # seq is gap-free from 1, so seq n lives at index n - 1.
            tail = entry.history[max(after_seq, 0) :]
            return [_copy_event(e) for e in _limited(tail, limit)]

    # -- claiming and leases -----------------------------------------------

    def claim_runs(
        self,
        worker: str,
        workflows: Collection[str],
        limit: int,
        lease_seconds: float,
        max_recoveries: int,
        queues: Collection[str] | None = None,
    ) -> list[Claim]:
        with self._lock:
            self._check_open()
            if limit <= 0:
                return []
            now = self.clock()
            wanted = set(workflows)
            served = set(queues) if queues is not None else None
            # Lanes: every (queue, tenant) with a run that has a runnable_at,
            # as the SQL backends enumerate them from their index.
            tenants: dict[str, set[str]] = {}
            running: dict[tuple[str, str], int] = {}
            for entry in self._runs.values():
                rec = entry.record
                if entry.runnable_at is None or (served is not None and rec.queue not in served):
                    continue
                tenants.setdefault(rec.queue, set()).add(rec.tenant)
            for entry in self._runs.values():
                if entry.record.status is RunStatus.RUNNING:
                    key = (entry.record.queue, entry.record.tenant)
                    running[key] = running.get(key, 0) + 1
            lanes: dict[tuple[str, str], admission.Lane] = {}
            for queue, names in sorted(tenants.items()):
                ordered = sorted(names)

                def next_tenant(after: str, ordered: list[str] = ordered) -> str | None:
                    i = bisect.bisect_right(ordered, after)
                    return ordered[i] if i < len(ordered) else None

                window = admission.lane_window(next_tenant, self._lane_cursor.after(queue))
                self._lane_cursor.saw(queue, window)
                for tenant in window:
                    lanes[(queue, tenant)] = admission.Lane(queue, tenant, running.get((queue, tenant), 0))
            due = sorted(
                (e for e in self._runs.values()
                 if e.runnable_at is not None and e.runnable_at <= now and e.record.workflow in wanted
                 and (e.record.queue, e.record.tenant) in lanes),
                key=_claim_order,
            )
            for entry in due:
                lane = lanes[(entry.record.queue, entry.record.tenant)]
                if len(lane.candidates) < limit:
                    assert entry.runnable_at is not None
                    lane.candidates.append(admission.Candidate(
                        entry.record.run_id, entry.record.queue, entry.record.tenant, entry.record.priority,
                        entry.runnable_at, entry.record.status is RunStatus.RUNNING))
            queue_running: dict[str, int] = {}
            for (queue, _), count in running.items():
                queue_running[queue] = queue_running.get(queue, 0) + count
            chosen = admission.plan(
                list(lanes.values()), self._queues, queue_running, self._buckets, now, limit)
            claims: list[Claim] = []
            claimed: list[admission.Candidate] = []
            for candidate in chosen:
                claim = self._claim(self._runs[candidate.run_id], worker, now, lease_seconds, max_recoveries)
                if claim is not None:  # None: a takeover that quarantined its run
                    claims.append(claim)
                    claimed.append(candidate)
            self._buckets.update(admission.charge(self._queues, self._buckets, claimed, now))
            return claims

    # -- queues ------------------------------------------------------------------

    def set_queue(self, limits: admission.QueueLimits) -> None:
        with self._lock:
            self._check_open()
            if limits.unlimited:
                self._queues.pop(limits.name, None)
            else:
                self._queues[limits.name] = limits
            for key in [k for k in self._buckets if k[0] == limits.name]:
                if (limits.rate if key[1] == admission.QUEUE_WIDE else limits.tenant_rate) is None:
                    del self._buckets[key]

    def queue_stats(self) -> list[admission.QueueStats]:
        with self._lock:
            self._check_open()
            now = self.clock()
            counts: dict[str, tuple[int, int]] = {}
            for entry in self._runs.values():
                if entry.runnable_at is not None:
                    running, runnable = counts.get(entry.record.queue, (0, 0))
                    counts[entry.record.queue] = (running + (entry.record.status is RunStatus.RUNNING),
                                                  runnable + (entry.runnable_at <= now))
            return admission.stats(self._queues, counts)

    def claim_run(self, run_id: str, worker: str, lease_seconds: float, max_recoveries: int) -> Claim | None:
        with self._lock:
            self._check_open()
            entry = self._runs.get(run_id)
            now = self.clock()
            if entry is None or entry.runnable_at is None or entry.runnable_at > now:
                return None
            return self._claim(entry, worker, now, lease_seconds, max_recoveries)

    def reclaim_owned(self, worker: str) -> int:
        with self._lock:
            self._check_open()
            now = self.clock()
            count = 0
            for entry in self._runs.values():
                rec = entry.record
                if rec.status is RunStatus.RUNNING and rec.owner == worker:
                    # The lease is treated as expired now: the next claim is a
                    # takeover, which counts a recovery and fences the old epoch.
                    entry.record = replace(rec, lease_expires_at=now, updated_at=now)
                    entry.runnable_at = now
                    count += 1
            return count

    def renew_leases(self, worker: str, leases: Mapping[str, int], lease_seconds: float) -> set[str]:
        with self._lock:
            self._check_open()
            now = self.clock()
            until = now + lease_seconds
            lost: set[str] = set()
            for run_id, epoch in leases.items():
                entry = self._runs.get(run_id)
                if entry is None or not _held(entry.record, worker, epoch):
                    lost.add(run_id)
                    continue
                entry.record = replace(entry.record, lease_expires_at=until, updated_at=now)
                entry.runnable_at = until
            return lost

    # -- fenced writes by the lease holder -----------------------------------

    def append(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], *, barrier: bool = False
    ) -> None:
        # ``barrier`` asks for stable storage before returning. Memory has none
        # to offer: the entries are as durable as they will ever be once they
        # are in the list, so a barrier append is an ordinary append.
        with self._lock:
            self._check_open()
            entry = self._fenced(run_id, epoch)
            prepared = self._prepare_appends(entry, epoch, events)
            entry.history.extend(prepared)

    def suspend_run(
        self,
        run_id: str,
        epoch: int,
        event: HistoryEvent,
        wake_at: float | None,
        waiting_on: str | None,
        status: RunStatus = RunStatus.SUSPENDED,
    ) -> None:
        if status not in _PARKED:
            raise ValueError(f"suspend_run parks a run as suspended or needs_attention, not {status}")
        with self._lock:
            self._check_open()
            entry = self._fenced(run_id, epoch)
            prepared = self._prepare_appends(entry, epoch, [event])
            now = self.clock()
            runnable_at: float | None
            if status is RunStatus.NEEDS_ATTENTION:
                runnable_at = None  # only resolve_operation makes it runnable again
            elif waiting_on is not None:
                # Waiting on a child: runnable when it ends, or now if it
                # already has (the child's finish cannot wake us twice).
                child = self._runs.get(waiting_on)
                runnable_at = now if child is not None and child.record.status.terminal else None
            else:
                # With neither a timer nor a child this is a budget suspension:
                # not runnable until set_budget wakes it.
                runnable_at = wake_at
            entry.history.extend(prepared)
            entry.record = replace(
                entry.record,
                status=status,
                owner=None,
                lease_expires_at=None,
                wake_at=wake_at,
                waiting_on=waiting_on,
                updated_at=now,
            )
            entry.runnable_at = runnable_at

    def release_run(self, run_id: str, epoch: int, event: HistoryEvent) -> None:
        with self._lock:
            self._check_open()
            entry = self._fenced(run_id, epoch)
            prepared = self._prepare_appends(entry, epoch, [event])
            now = self.clock()
            entry.history.extend(prepared)
            entry.record = replace(
                entry.record, status=RunStatus.PENDING, owner=None, lease_expires_at=None, updated_at=now
            )
            entry.runnable_at = now

    def finish_run(
        self,
        run_id: str,
        epoch: int,
        event: HistoryEvent,
        status: RunStatus,
        result: Payload | None,
        error: dict[str, Any] | None,
    ) -> None:
        if status not in _FINISH_STATUSES:
            raise ValueError(f"finish_run takes completed or failed, not {status}")
        with self._lock:
            self._check_open()
            entry = self._fenced(run_id, epoch)
            prepared = self._prepare_appends(entry, epoch, [event])
            stored_error = _copy_json(error)
            now = self.clock()
            entry.history.extend(prepared)
            entry.record = replace(
                entry.record,
                status=status,
                owner=None,
                lease_expires_at=None,
                result=_norm_payload(result),
                error=stored_error,
                updated_at=now,
            )
            entry.runnable_at = None
            self._wake_waiting_parent(entry.record, now)

    def start_child(self, parent_run_id: str, epoch: int, event: HistoryEvent, child: NewRun) -> RunRecord:
        # Normalising the budget first also validates it before anything changes.
        child = replace(child, parent_run_id=parent_run_id, budget=_copy_json(child.budget))
        with self._lock:
            self._check_open()
            parent = self._fenced(parent_run_id, epoch)
            prepared = self._prepare_appends(parent, epoch, [event])
            parent.history.extend(prepared)
            existing = self._runs.get(child.run_id)
            if existing is not None:
                return _copy_record(existing.record)
            now = self.clock()
            entry = self._insert(child, now, status=RunStatus.PENDING, runnable_at=now)
            self._append_auto(entry, EventType.RUN_CREATED, now, 0, None, _created_detail(child))
            return _copy_record(entry.record)

    # -- operator actions (bump the epoch) ------------------------------------

    def cancel_run(self, run_id: str, reason: str) -> RunRecord:
        with self._lock:
            self._check_open()
            root = self._runs.get(run_id)
            if root is None:
                raise RunNotFound(run_id)
            now = self.clock()
            error = {"type": "Cancelled", "message": reason}
            for entry in self._tree(run_id):
                rec = entry.record
                if rec.status.terminal:
                    continue
                epoch = rec.epoch + 1
                entry.record = replace(
                    rec,
                    status=RunStatus.CANCELLED,
                    owner=None,
                    epoch=epoch,
                    lease_expires_at=None,
                    wake_at=None,
                    error=dict(error),
                    updated_at=now,
                )
                entry.runnable_at = None
                self._append_auto(entry, EventType.RUN_CANCELLED, now, epoch, None, {"reason": reason})
                self._wake_waiting_parent(entry.record, now)
            return _copy_record(root.record)

    def retry_run(self, run_id: str) -> RunRecord:
        with self._lock:
            self._check_open()
            entry = self._runs.get(run_id)
            if entry is None:
                raise RunNotFound(run_id)
            rec = entry.record
            if rec.status not in _RETRYABLE:
                raise InvalidRunState(
                    f"run {run_id!r} is {rec.status.value}; only failed or quarantined runs can be retried"
                )
            from_position = next(
                (e.position for e in reversed(entry.history) if e.event is EventType.STEP_FAILED), None
            )
            now = self.clock()
            epoch = rec.epoch + 1
            entry.record = replace(
                rec,
                status=RunStatus.PENDING,
                owner=None,
                epoch=epoch,
                lease_expires_at=None,
                wake_at=None,
                waiting_on=None,
                recoveries=0,
                error=None,
                updated_at=now,
            )
            entry.runnable_at = now
            detail = {"from_position": from_position, "previous_status": rec.status.value}
            self._append_auto(entry, EventType.RUN_RETRIED, now, epoch, None, detail)
            return _copy_record(entry.record)

    def resolve_operation(
        self, run_id: str, position: int, done: bool, result: Payload | None, detail: dict[str, Any]
    ) -> RunRecord:
        with self._lock:
            self._check_open()
            entry = self._runs.get(run_id)
            if entry is None:
                raise RunNotFound(run_id)
            rec = entry.record
            if rec.status is not RunStatus.NEEDS_ATTENTION:
                raise InvalidRunState(
                    f"run {run_id!r} is {rec.status.value}; only runs that need attention have "
                    "operations to resolve"
                )
            if done:
                kind = EventType.STEP_COMPLETED
                entry_detail = _copy_json({"resolved_by": "operator", **detail})
                payload = _norm_payload(result)
            else:
                kind = EventType.OP_RESOLVED
                entry_detail = _copy_json({"position": position, "done": False, **detail})
                payload = None
            now = self.clock()
            epoch = self._reopen(entry, now)
            entry.history.append(
                HistoryEvent(
                    run_id=run_id,
                    seq=entry.max_seq + 1,
                    event=kind,
                    at=now,
                    epoch=epoch,
                    position=position,
                    step_kind=detail.get("step_kind", "tool"),
                    name=detail.get("name"),
                    payload=payload,
                    detail=entry_detail,
                )
            )
            return _copy_record(entry.record)

    def kill_runs(
        self, reason: str, *, run_id: str | None = None, tenant: str | None = None
    ) -> list[RunRecord]:
        if (run_id is None) == (tenant is None):
            raise ValueError("kill_runs takes exactly one of run_id and tenant")
        with self._lock:
            self._check_open()
            if run_id is not None:
                if run_id not in self._runs:
                    raise RunNotFound(run_id)
                scope = list(self._tree(run_id))
            else:
                scope = sorted(
                    (e for e in self._runs.values() if e.record.tenant == tenant), key=lambda e: e.order
                )
            live = [entry for entry in scope if not entry.record.status.terminal]
            now = self.clock()
            error = {"type": "Killed", "message": reason}
            killed: list[RunRecord] = []
            for entry in live:
                epoch = entry.record.epoch + 1
                entry.record = replace(
                    entry.record,
                    status=RunStatus.KILLED,
                    owner=None,
                    epoch=epoch,
                    lease_expires_at=None,
                    error=dict(error),
                    updated_at=now,
                )
                entry.runnable_at = None
                self._append_auto(entry, EventType.RUN_KILLED, now, epoch, None, {"reason": reason})
                self._wake_waiting_parent(entry.record, now)
                killed.append(_copy_record(entry.record))
            return killed

    def revive_run(self, run_id: str) -> RunRecord:
        with self._lock:
            self._check_open()
            entry = self._runs.get(run_id)
            if entry is None:
                raise RunNotFound(run_id)
            previous = entry.record.status
            if previous not in _REVIVABLE:
                raise InvalidRunState(
                    f"run {run_id!r} is {previous.value}; only killed or halted runs can be revived"
                )
            now = self.clock()
            epoch = self._reopen(entry, now)
            detail = {"previous_status": previous.value}
            self._append_auto(entry, EventType.RUN_REVIVED, now, epoch, None, detail)
            return _copy_record(entry.record)

    def set_budget(self, run_id: str, budget: dict[str, Any]) -> RunRecord:
        with self._lock:
            self._check_open()
            entry = self._runs.get(run_id)
            if entry is None:
                raise RunNotFound(run_id)
            if entry.record.status is RunStatus.RUNNING:
                raise InvalidRunState(f"run {run_id!r} is running; change its budget once it is suspended")
            stored = _copy_json(budget)
            now = self.clock()
            rec = entry.record
            if rec.status is RunStatus.SUSPENDED and rec.wake_at is None and rec.waiting_on is None:
                entry.runnable_at = now  # a budget suspension: the new limits may let it go on
            entry.record = replace(rec, budget=stored, updated_at=now)
            self._append_auto(entry, EventType.RUN_BUDGET_CHANGED, now, rec.epoch, None, {"budget": stored})
            return _copy_record(entry.record)

    def halt_run(self, run_id: str, epoch: int, event: HistoryEvent, error: dict[str, Any]) -> None:
        with self._lock:
            self._check_open()
            entry = self._fenced(run_id, epoch)
            prepared = self._prepare_appends(entry, epoch, [event])
            stored_error = _copy_json(error)
            now = self.clock()
            entry.history.extend(prepared)
            entry.record = replace(
                entry.record,
                status=RunStatus.HALTED,
                owner=None,
                epoch=epoch + 1,
                lease_expires_at=None,
                error=stored_error,
                updated_at=now,
            )
            entry.runnable_at = None
            self._wake_waiting_parent(entry.record, now)

    # -- retention -------------------------------------------------------------

    def prune_runs(
        self,
        older_than: float,
        statuses: Collection[RunStatus] | None = None,
        limit: int = 1000,
        *,
        dry_run: bool = False,
    ) -> int:
        wanted = prune_statuses(statuses)
        check_prune_limit(limit)
        with self._lock:
            self._check_open()
            roots = sorted(
                (
                    e.record
                    for e in self._runs.values()
                    if e.record.status in wanted
                    and e.record.updated_at < older_than
                    and (e.record.parent_run_id is None or e.record.parent_run_id not in self._runs)
                ),
                key=lambda rec: (rec.updated_at, rec.run_id),
            )
            trees = {
                rec.run_id: [(m.record.run_id, m.record.status.value, m.record.updated_at)
                             for m in self._tree(rec.run_id)]
                for rec in roots
            }
            doomed: list[str] = []
            choose_trees([rec.run_id for rec in roots], trees, wanted, older_than, limit, doomed)
            if dry_run:
                return len(doomed)
            now = self.clock()
            for run_id in doomed:
                entry = self._runs.pop(run_id)
                for ref in _refs_of(entry):
                    self._gc.setdefault(ref, now)
                self._children.pop(run_id, None)
                siblings = self._children.get(entry.record.parent_run_id or "")
                if siblings is not None and run_id in siblings:
                    siblings.remove(run_id)
            self._collect_artifacts(min(older_than, now - ARTIFACT_GRACE_SECONDS))
            return len(doomed)

    def _collect_artifacts(self, stored_before: float) -> None:
        """Delete queued artifacts nothing references any more and nobody
        stored since ``stored_before``; forget queued refs that are
        referenced again or already gone."""
        if not self._gc:
            return
        referenced = {ref for entry in self._runs.values() for ref in _refs_of(entry)}
        for ref in list(self._gc):
            if ref in referenced or ref not in self._artifacts:
                del self._gc[ref]
            elif self._touched.get(ref, 0.0) < stored_before:
                del self._artifacts[ref]
                self._touched.pop(ref, None)
                del self._gc[ref]

    # -- payloads too large to keep inline -------------------------------------

    def put_artifact(self, data: bytes) -> str:
        ref = hashlib.sha256(data).hexdigest()
        with self._lock:
            self._check_open()
            if ref not in self._artifacts:
                self._artifacts[ref] = bytes(data)
                self._gc.setdefault(ref, self.clock())  # collected if nothing ever references it
            # Stored again counts as stored now: pruning must not delete it
            # from under a writer about to reference it.
            self._touched[ref] = max(self._touched.get(ref, self.clock()), self.clock())
        return ref

    def get_artifact(self, ref: str) -> bytes:
        with self._lock:
            self._check_open()
            try:
                return self._artifacts[ref]
            except KeyError:
                raise PayloadError(f"artifact {ref!r} is missing from the memory store") from None

    # -- internals: each runs under the caller's lock ----------------------------

    def _insert(
        self,
        run: NewRun,
        now: float,
        *,
        status: RunStatus,
        runnable_at: float | None,
        epoch: int = 0,
        owner: str | None = None,
        lease_until: float | None = None,
    ) -> _Run:
        record = RunRecord(
            run_id=run.run_id,
            workflow=run.workflow,
            workflow_version=run.workflow_version,
            tenant=run.tenant,
            thread_id=run.thread_id,
            status=status,
            input=run.input,
            result=None,
            error=None,
            epoch=epoch,
            owner=owner,
            lease_expires_at=lease_until,
            wake_at=None,
            waiting_on=None,
            recoveries=0,
            queue=run.queue,
            priority=run.priority,
            parent_run_id=run.parent_run_id,
            created_at=now,
            updated_at=now,
            budget=_copy_json(run.budget),
        )
        entry = _Run(record=record, runnable_at=runnable_at, order=next(self._order))
        self._runs[run.run_id] = entry
        if run.parent_run_id is not None:
            self._children.setdefault(run.parent_run_id, []).append(run.run_id)
        return entry

    def _append_auto(
        self,
        entry: _Run,
        event: EventType,
        at: float,
        epoch: int,
        worker: str | None,
        detail: dict[str, Any] | None,
    ) -> None:
        """Append after the current maximum: for the store's own entries."""
        entry.history.append(
            HistoryEvent(
                run_id=entry.record.run_id,
                seq=entry.max_seq + 1,
                event=event,
                at=at,
                epoch=epoch,
                worker=worker,
                detail=_copy_json(detail),
            )
        )

    def _reopen(self, entry: _Run, now: float) -> int:
        """Make the run ``pending`` and runnable now at the next epoch, with
        nothing left of its last stop (no owner, timer, child wait or error);
        returns the new epoch."""
        epoch = entry.record.epoch + 1
        entry.record = replace(
            entry.record,
            status=RunStatus.PENDING,
            owner=None,
            epoch=epoch,
            lease_expires_at=None,
            wake_at=None,
            waiting_on=None,
            error=None,
            updated_at=now,
        )
        entry.runnable_at = now
        return epoch

    def _fenced(self, run_id: str, epoch: int) -> _Run:
        """The run, if it is ``running`` at exactly ``epoch``; else ``LeaseLost``."""
        entry = self._runs.get(run_id)
        if entry is None or entry.record.status is not RunStatus.RUNNING or entry.record.epoch != epoch:
            raise LeaseLost(run_id, epoch)
        return entry

    def _prepare_appends(self, entry: _Run, epoch: int, events: Sequence[HistoryEvent]) -> list[HistoryEvent]:
        """Validate and copy a holder's events without storing them yet, so a
        failure leaves the history exactly as it was."""
        run_id = entry.record.run_id
        expected = entry.max_seq + 1
        prepared: list[HistoryEvent] = []
        for event in events:
            if event.run_id != run_id:
                raise ValueError(f"event for run {event.run_id!r} appended to run {run_id!r}")
            if event.seq != expected:
                # Someone else appended (seq taken) or the holder's counter is
                # off: either way its view of the history is not the store's.
                raise LeaseLost(run_id, epoch)
            prepared.append(_copy_event(event))
            expected += 1
        return prepared

    def _claim(
        self, entry: _Run, worker: str, now: float, lease_seconds: float, max_recoveries: int
    ) -> Claim | None:
        rec = entry.record
        takeover = rec.status is RunStatus.RUNNING
        recoveries = rec.recoveries
        if takeover:
            recoveries += 1
            lost = {"worker": rec.owner, "epoch": rec.epoch, "reason": "expired"}
            self._append_auto(entry, EventType.LEASE_LOST, now, rec.epoch, rec.owner, lost)
            if recoveries > max_recoveries:
                error = {
                    "type": "Quarantined",
                    "message": f"run lost its worker {recoveries} times (limit {max_recoveries})",
                }
                entry.record = replace(
                    rec,
                    status=RunStatus.QUARANTINED,
                    owner=None,
                    epoch=rec.epoch + 1,
                    lease_expires_at=None,
                    recoveries=recoveries,
                    error=dict(error),
                    updated_at=now,
                )
                entry.runnable_at = None
                self._append_auto(entry, EventType.RUN_QUARANTINED, now, rec.epoch + 1, None, error)
                return None
        until = now + lease_seconds
        epoch = rec.epoch + 1
        entry.record = replace(
            rec,
            status=RunStatus.RUNNING,
            owner=worker,
            epoch=epoch,
            lease_expires_at=until,
            wake_at=None,
            waiting_on=None,
            recoveries=recoveries,
            updated_at=now,
        )
        entry.runnable_at = until
        if takeover:
            taken = {"from_worker": rec.owner, "lease_until": until}
            self._append_auto(entry, EventType.LEASE_TAKEN_OVER, now, epoch, worker, taken)
        else:
            self._append_auto(entry, EventType.LEASE_CLAIMED, now, epoch, worker, {"lease_until": until})
            if rec.status is RunStatus.PENDING and rec.epoch == 0:
                self._append_auto(entry, EventType.RUN_STARTED, now, epoch, worker, None)
            elif rec.status is RunStatus.SUSPENDED:
                self._append_auto(entry, EventType.RUN_WOKEN, now, epoch, worker, None)
        return self._claim_of(entry)

    def _claim_of(self, entry: _Run) -> Claim:
        return Claim(
            run=_copy_record(entry.record),
            history=[_copy_event(e) for e in entry.history],
            next_seq=entry.max_seq + 1,
        )

    def _wake_waiting_parent(self, child: RunRecord, now: float) -> None:
        """Make the parent runnable if it is suspended waiting on ``child``."""
        if child.parent_run_id is None:
            return
        parent = self._runs.get(child.parent_run_id)
        if (
            parent is not None
            and parent.record.status is RunStatus.SUSPENDED
            and parent.record.waiting_on == child.run_id
        ):
            parent.runnable_at = now
            parent.record = replace(parent.record, updated_at=now)

    def _tree(self, run_id: str) -> Iterator[_Run]:
        """The run and all its descendants, parents before children.

        Walks through terminal runs too: a finished child may have left live
        grandchildren behind, and those still belong to the cancelled tree.
        """
        stack = [run_id]
        seen: set[str] = set()
        while stack:
            rid = stack.pop()
            if rid in seen:
                continue
            seen.add(rid)
            entry = self._runs.get(rid)
            if entry is None:
                continue
            yield entry
            stack.extend(reversed(self._children.get(rid, [])))


# -- pure helpers ---------------------------------------------------------------


def _refs_of(entry: _Run) -> Iterator[str]:
    """Every artifact reference the run holds: input, result, history payloads."""
    rec = entry.record
    if rec.input.ref is not None:
        yield rec.input.ref
    if rec.result is not None and rec.result.ref is not None:
        yield rec.result.ref
    for event in entry.history:
        if event.payload is not None and event.payload.ref is not None:
            yield event.payload.ref


def _claim_order(entry: _Run) -> tuple[int, float, int]:
    assert entry.runnable_at is not None
    return (-entry.record.priority, entry.runnable_at, entry.order)


def _held(rec: RunRecord, worker: str, epoch: int) -> bool:
    return rec.status is RunStatus.RUNNING and rec.owner == worker and rec.epoch == epoch


def _matches(rec: RunRecord, f: RunFilter) -> bool:
    return (
        (f.statuses is None or rec.status in f.statuses)
        and (f.tenant is None or rec.tenant == f.tenant)
        and (f.workflow is None or rec.workflow == f.workflow)
        and (f.thread_id is None or rec.thread_id == f.thread_id)
        and (f.parent_run_id is None or rec.parent_run_id == f.parent_run_id)
    )


def _limited(items: list[_T], limit: int | None) -> list[_T]:
    """``items[:limit]``, with SQL's reading of a negative limit: no limit."""
    if limit is None or limit < 0:
        return items
    return items[:limit]


def _copy_json(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A private copy of a JSON-shaped dict, normalised the way a JSON column
    would normalise it (tuples become lists, keys become strings)."""
    if value is None:
        return None
    copied: dict[str, Any] = json.loads(json.dumps(value))
    return copied


def _norm_payload(payload: Payload | None) -> Payload | None:
    """An empty payload reads back as ``None``, as it does from SQL columns."""
    if payload is None or (payload.data is None and payload.ref is None):
        return None
    return payload


def _copy_record(rec: RunRecord) -> RunRecord:
    if rec.error is None and rec.budget is None:
        return rec
    return replace(rec, error=_copy_json(rec.error), budget=_copy_json(rec.budget))


def _copy_event(event: HistoryEvent) -> HistoryEvent:
    payload = _norm_payload(event.payload)
    if event.detail is None and payload is event.payload:
        return event
    return replace(event, detail=_copy_json(event.detail), payload=payload)
