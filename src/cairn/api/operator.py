"""The operator: every action a person (or a program acting for one) takes on
runs, in one place.

Cancel, kill, revive, retry, budget, resolving uncertain operations, queue
limits and pruning all go through ``Operator``: ``App``'s methods delegate
here, every ``cairn`` command comes here, and the HTTP API of a later issue
will be a thin layer over the same object. Three rules hold for every action:

- **One precondition check.** Run-state rules (which statuses may be retried,
  revived, resolved...) are the store's; they are checked there, atomically
  with the change. The operator checks only what the store cannot know, such
  as whether an operation is uncertain (a reading of the history).
- **Typed results.** An action returns what it did (``Change``: the run
  before and after), not a record to be re-read and re-interpreted.
- **An acting identity.** The operator is built with an ``actor``
  (``"cli:ada@host"``, ``"app:4242"``, later ``"http:<subject>"``), recorded
  in the history entry each action appends.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, fields, replace
from typing import Any

import msgspec

from cairn.api.actors import acting
from cairn.api.approvals import NO_EDIT, ApprovalView
from cairn.api.approvals import view as approval_view
from cairn.api.erasure import KILL_REASON, Erasure, Target
from cairn.api.erasure import erase as erase_target
from cairn.api.ledger import Ledger, OperationView, resolution_request
from cairn.api.retention import Retention
from cairn.api.workspaces import WorkspaceViews
from cairn.codec import schemas, values
from cairn.codec.payloads import PayloadCodec
from cairn.engine.approvalmessages import decision_message
from cairn.engine.budget import Budget
from cairn.engine.bundles import Bundle, BundleDamaged
from cairn.engine.messaging import check_name, signal_key
from cairn.engine.startedwith import NOBODY, StartedWith
from cairn.errors import (
    ApprovalNotFound,
    InvalidArgument,
    InvalidEdit,
    InvalidRunState,
    PayloadError,
    RunNotFound,
)
from cairn.memory.api import Item, Memory, Message, SearchResult, item_of, message_of
from cairn.memory.direct import direct_memory
from cairn.memory.policy import MemoryPolicy
from cairn.memory.tiering import ItemTiering
from cairn.store import dialect, open_store
from cairn.store.admission import QueueLimits, QueueShare, QueueStats
from cairn.store.contract import Migratable, Store
from cairn.store.erasuresql import ErasureRecord
from cairn.store.memrecords import ItemTierMove, ItemTierUsage, MemoryScope
from cairn.store.namespaces import encode_namespace, encode_prefix
from cairn.store.records import (
    Approval,
    ApprovalStatus,
    ArchiveRecord,
    BundleRecord,
    Delivery,
    EventType,
    HistoryEvent,
    Payload,
    RunRecord,
    RunStatus,
    UsageTotals,
)
from cairn.store.sqlfiles import load_migrations
from cairn.store.vectorindex import TierUsage

#: A bundle marked served less than this many seconds ago has a live worker
#: (workers say so every ``Registry.REFRESH_SECONDS``).
SERVED_RECENTLY = 5.0

log = logging.getLogger("cairn.memory")


@dataclass(frozen=True, slots=True)
class BundleView:
    """A bundle as ``cairn bundles`` shows it: its identity, when a worker
    last served it, its runs per status and the names it pins.
    ``bundle_id=None``: runs older than bundles. ``damaged``: why the
    stored row is not what its id says."""

    bundle_id: str | None
    workflow: str
    version: str
    code: str | None
    created_at: float | None
    served_at: float | None
    runs: dict[str, int]
    prompts: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    damaged: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def limits_change(limits: QueueLimits | QueueShare) -> dict[str, Any]:
    """A queue's limits or a tenant's share as the operator log records them."""
    return {f.name: (None if v is None else {"limit": v.limit, "period": v.period, "burst": v.burst}
                     if hasattr(v, "period") else v)
            for f in fields(limits) for v in (getattr(limits, f.name),)}


def app_actor() -> str:
    """The identity of a program acting through its ``App``."""
    return f"app:{os.getpid()}"


def cli_actor() -> str:
    """The identity of a person at the ``cairn`` command: ``cli:user@host``,
    the user of the process's uid (``getpass.getuser`` reads ``$USER`` first,
    so ``USER=ada cairn approve`` decided as ada), or ``user:NAME`` when
    ``$CAIRN_ACTOR`` names a configured identity (control characters dropped)."""
    configured = "".join(ch for ch in os.environ.get("CAIRN_ACTOR", "") if ch.isprintable())[:200]
    if configured.strip():
        return f"user:{configured.strip()}"
    if not hasattr(os, "getuid"):  # Windows: no uid, the login name
        return f"cli:{getpass.getuser()}@{socket.gethostname()}"
    try:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # no name for this uid (containers)
        user = str(os.getuid())
    return f"cli:{user}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class Change:
    """What an action did to one run: the run before and after it."""

    before: RunRecord
    run: RunRecord

    @property
    def changed(self) -> bool:
        """Whether the action changed the run (cancelling a finished run does not)."""
        return self.run.epoch != self.before.epoch or self.run.status is not self.before.status


@dataclass(frozen=True, slots=True)
class Archived:
    """What an archiving pass did: the runs archived, and those it left hot
    (each with why: changed meanwhile, archived by another pass...)."""

    archived: list[ArchiveRecord]
    skipped: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Retried(Change):
    """A retry, and the position the run resumes from (``None``: the top of its journal)."""

    from_position: int | None = None


@dataclass(frozen=True, slots=True)
class Resolved(Change):
    """A resolved operation, as it stood before the operator settled it."""

    operation: OperationView | None = None


@dataclass(frozen=True, slots=True)
class RunOperations:
    """A run and its tool calls."""

    run: RunRecord
    operations: list[OperationView]

    def uncertain(self) -> list[OperationView]:
        """The calls an operator must settle: uncertain ones of a run that needs attention."""
        if self.run.status is not RunStatus.NEEDS_ATTENTION:
            return []
        return [op for op in self.operations if op.uncertain]


@dataclass(frozen=True, slots=True)
class Sent:
    """A signal put into a run's mailbox: the message, and whether this call
    delivered it (``False``: an earlier send with the same ``dedupe`` did)."""

    delivery: Delivery
    created: bool


@dataclass(frozen=True, slots=True)
class Published:
    """The latest value a run published under a key (``ctx.set_event``)."""

    run_id: str
    key: str
    value: Any
    seq: int
    at: float


class Operator:
    """Performs operator actions on the runs of one store, as ``actor``."""

    def __init__(self, store: Store, codec: PayloadCodec, actor: str, *,
                 memory: MemoryPolicy | None = None) -> None:
        self._store = store
        self.codec = codec
        self.actor = actor
        self.memory_policy = memory if memory is not None else MemoryPolicy()

    def acting_as(self, actor: str) -> Operator:
        """The same operator under another identity (the CLI on an ``--app``'s store)."""
        return Operator(self._store, self.codec, actor, memory=self.memory_policy)

    # -- reading ---------------------------------------------------------------------------

    @property
    def workspaces(self) -> WorkspaceViews:
        """Runs' workspace snapshots: list, diff, restore, export (``api.workspaces``)."""
        return WorkspaceViews(self._store)

    def get_run(self, run_id: str) -> RunRecord:
        record = self._store.get_run(run_id)
        if record is None:
            raise RunNotFound(run_id)
        return record

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        """The run's history entries after ``after_seq`` (at most ``limit``)."""
        return self._store.history(run_id, after_seq, limit)

    def started_with(self, run_id: str) -> StartedWith:
        """The token role and token id the run was started with, from its
        row (what per-tool authorization reads: ``engine.startedwith``)."""
        pair = self._store.started_with(run_id)
        return NOBODY if pair is None else StartedWith(*pair)

    def usage(self, run_id: str) -> UsageTotals:
        """What the run has spent and its last ``seq``, summed by the store
        (its history stays in the database)."""
        return self._store.run_usage(run_id)

    def operations(self, run_id: str) -> RunOperations:
        """The run and its tool calls (see ``cairn.api.ledger``)."""
        run = self.get_run(run_id)
        ledger = Ledger(run_id, self._store.history(run_id))
        return RunOperations(run, ledger.views(self.codec))

    # -- actions on runs -------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "cancelled by operator") -> Change:
        """Cancel a run and its unfinished children; a finished run is left as
        it is (``Change.changed`` is false)."""
        before = self.get_run(run_id)
        return Change(before, self._cancel_run(run_id, reason))

    def kill(self, run_id: str | None = None, *, tenant: str | None = None,
             reason: str = "killed by operator") -> list[RunRecord]:
        """The kill switch: a run and its descendants, or every unfinished run
        of a tenant; returns the runs killed."""
        return self._kill_runs(reason, run_id, tenant)

    def revive(self, run_id: str) -> Change:
        """Resume a killed or halted run where it stopped."""
        before = self.get_run(run_id)
        return Change(before, self._revive_run(run_id))

    def retry(self, run_id: str) -> Retried:
        """Resume a failed or quarantined run from its last good step."""
        before = self.get_run(run_id)
        run = self._retry_run(run_id)
        retried = next((e for e in reversed(self._store.history(run_id))
                        if e.event is EventType.RUN_RETRIED), None)
        position = (retried.detail or {}).get("from_position") if retried is not None else None
        return Retried(before, run, None if position is None else int(position))

    def set_budget(self, run_id: str, budget: Budget, *, keep_others: bool = False) -> Change:
        """Replace a run's budget; with ``keep_others`` a limit ``budget``
        leaves unset keeps its current value. A run suspended for its budget
        continues."""
        before = self.get_run(run_id)
        if keep_others:
            current = Budget.from_dict(before.budget) or Budget()
            given = {f.name: getattr(budget, f.name) for f in fields(budget)
                     if getattr(budget, f.name) is not None}
            budget = replace(current, **given)
        return Change(before, self._set_budget(run_id, budget.to_dict()))

    def resolve(self, run_id: str, position: int, *, done: bool, result: Any = None) -> Resolved:
        """Settle the uncertain operation at ``position``: ``done`` records
        ``result`` as the tool's result; not done executes it again with the
        same operation id. Checked here: that it is uncertain, and that a
        ``done`` result fits the tool's result type as the run's bundle pinned
        it (its JSON Schema; the run would otherwise fail on replay, unable to
        read what the operator recorded). That the run needs attention is the
        store's rule."""
        before = self.get_run(run_id)
        ledger = Ledger(run_id, self._store.history(run_id))
        payload = self.codec.dump(result)[0] if done else None
        request = resolution_request(before, ledger, position, done=done, result=payload)
        operation = ledger.view(position, self.codec)
        if done and operation is not None:
            self._check_result(before, operation.tool, result)
        run = self._resolve_operation(run_id, request.position, request.done, request.result, request.detail)
        return Resolved(before, run, operation)

    def _check_result(self, run: RunRecord, tool: str, result: Any) -> None:
        """``InvalidArgument`` unless ``result`` fits the JSON Schema that
        ``run``'s bundle records for ``tool``'s result. Nothing to check
        against (a run older than bundles, a bundle this store does not hold,
        a result type with no JSON Schema) lets it through, as before."""
        schema = self._result_schema(run, tool)
        if schema is None:
            return
        what = f"the result does not fit tool {tool!r}'s result type (as run {run.run_id!r} pinned it)"
        try:
            schemas.check(msgspec.json.decode(values.encode(result)), schema, what=what)
        except PayloadError as exc:
            raise InvalidArgument(str(exc)) from None

    def _result_schema(self, run: RunRecord, tool: str) -> dict[str, Any] | None:
        record = self._stored_bundle(run)
        if record is None:
            return None
        try:
            pinned = Bundle.from_record(record)
        except BundleDamaged:
            return None  # ``cairn bundles`` reports it; the resolution does not hinge on it
        for fingerprint in pinned.tools:
            schema = fingerprint.get("schema")
            if fingerprint.get("name") == tool and isinstance(schema, dict):
                return schema
        return None

    def _stored_bundle(self, run: RunRecord) -> BundleRecord | None:
        """The stored bundle ``run`` is pinned to (``None``: none, or not in this store)."""
        if run.bundle is None:
            return None
        return next((b for b in self._store.bundles([run.workflow]) if b.bundle_id == run.bundle), None)

    # -- approvals ----------------------------------------------------------------------------

    def approvals(
        self, *, tenant: str | None = None, run_id: str | None = None, pending: bool = True,
        limit: int = 1000,
    ) -> list[ApprovalView]:
        """Approval requests, oldest first: those still awaiting a decision
        (``pending``), or every one with its decision."""
        found = self._store.approvals(tenant=tenant, run_id=run_id, pending=pending, limit=limit)
        return [approval_view(self.codec, approval) for approval in found]

    def approval(self, run_id: str, request_id: str) -> ApprovalView:
        """One request, decided or not; ``RunNotFound`` / ``ApprovalNotFound``."""
        return approval_view(self.codec, self._approval(run_id, request_id))

    def approve(
        self, run_id: str, request_id: str, *, comment: str | None = None, edit: Any = NO_EDIT
    ) -> ApprovalView:
        """Approve request ``request_id`` of run ``run_id``, as requested or,
        with ``edit``, with other data: it must fit the request's type (its
        JSON Schema, recorded by the run), or ``InvalidEdit`` and nothing is
        stored. The run continues with exactly that data."""
        if edit is NO_EDIT:
            return self._decide(run_id, request_id, ApprovalStatus.APPROVED, comment, None)
        approval = self._approval(run_id, request_id)
        what = f"the edit does not fit approval request {request_id} ({approval.type_name})"
        try:
            plain = msgspec.json.decode(values.encode(edit))
        except PayloadError as exc:
            raise InvalidEdit(f"{what}: {exc}") from None
        if approval.schema is None:
            raise InvalidEdit(f"{what}: the request records no schema to check an edit against")
        try:
            schemas.check(plain, approval.schema, what=what)
        except PayloadError as exc:
            raise InvalidEdit(str(exc)) from None
        return self._decide(run_id, request_id, ApprovalStatus.EDITED, comment, plain)

    def reject(self, run_id: str, request_id: str, *, comment: str | None = None) -> ApprovalView:
        """Reject request ``request_id`` of run ``run_id``."""
        return self._decide(run_id, request_id, ApprovalStatus.REJECTED, comment, None)

    def _approval(self, run_id: str, request_id: str) -> Approval:
        found = self._store.approvals(run_id=run_id, request_id=request_id, pending=False, limit=1)
        if not found:
            self.get_run(run_id)  # RunNotFound first: another tenant's run is no run at all
            raise ApprovalNotFound(run_id, request_id)
        return found[0]

    def _decide(
        self, run_id: str, request_id: str, status: ApprovalStatus, comment: str | None, edited: Any
    ) -> ApprovalView:
        if comment is not None and not isinstance(comment, str):
            raise InvalidArgument("a decision's comment is text")
        if comment is not None and "\x00" in comment:  # PostgreSQL's text cannot hold it: one rule for both
            raise InvalidArgument("a decision's comment must not hold a NUL character")
        payload = self.codec.wrap(decision_message(status, comment, edited))
        approval = self._store.decide_approval(run_id, request_id, status, payload, comment, actor=self.actor)
        return approval_view(self.codec, approval)

    # -- queues ----------------------------------------------------------------------------

    def set_queue(self, limits: QueueLimits) -> QueueLimits:
        """Replace a queue's limits for every worker (none: unlimited)."""
        with acting(self._store, self.actor, "", "queue", limits.name,
                    "queue.clear" if limits.unlimited else "queue.set", limits_change(limits)):
            self._store.set_queue(limits)
        return limits

    def clear_queue(self, name: str) -> QueueLimits:
        """Remove a queue's limits: it admits every runnable run again."""
        return self.set_queue(QueueLimits(name))

    def set_queue_share(self, share: QueueShare) -> QueueShare:
        """Replace one tenant's own caps in a queue, on its running runs
        and on its claims' rate (neither: remove the share). It holds back
        that tenant's runs of the queue only, on top of the queue's limits:
        never raises them, never touches another tenant; a rate above the
        queue's per-tenant rate raises ``InvalidArgument``
        (``cairn.store.admission``)."""
        with acting(self._store, self.actor, share.tenant, "queue_share", share.queue,
                    "queue_share.clear" if share.unset else "queue_share.set", limits_change(share)):
            self._store.set_queue_share(share)
        return share

    def queue_shares(self, tenant: str | None = None) -> list[QueueShare]:
        """Every tenant's own queue shares; with ``tenant``, that tenant's."""
        return self._store.queue_shares(tenant)

    def queues(self, tenant: str | None = None) -> list[QueueStats]:
        """Every queue with limits or live runs, with its load; with
        ``tenant``, the queues with limits or with that tenant's live runs,
        and only its load."""
        return self._store.queue_stats(tenant)

    def run_counts(self) -> list[tuple[str, str, str, int]]:
        """``(tenant, workflow, status, runs)``: how many runs there are of
        each (the metrics' runs by status)."""
        return self._store.run_counts()

    # -- bundles (cairn.engine.bundles) ------------------------------------------------------

    def bundles(self) -> list[BundleView]:
        """Every stored bundle with its runs per status, and a line per
        workflow version for runs older than bundles (``bundle_id=None``)."""
        by_bundle: dict[str, dict[str, int]] = {}
        legacy: dict[tuple[str, str], dict[str, int]] = {}
        for bid, workflow, version, status, n in self._store.bundle_counts():
            runs = (by_bundle.setdefault(bid, {}) if bid is not None
                    else legacy.setdefault((workflow, version), {}))
            runs[status] = runs.get(status, 0) + n
        views = []
        for record in self._store.bundles():
            try:
                pinned: Bundle | None = Bundle.from_record(record)
                damage = None
            except BundleDamaged as exc:
                pinned, damage = None, str(exc)
            views.append(BundleView(
                record.bundle_id, record.workflow, record.version, record.code, record.created_at,
                record.served_at, by_bundle.pop(record.bundle_id, {}),
                tuple(sorted(pinned.prompts)) if pinned else (),
                tuple(sorted(pinned.models)) if pinned else (),
                tuple(str(t.get("name")) for t in pinned.tools) if pinned else (), damage))
        for bid, runs in sorted(by_bundle.items()):  # runs of a bundle this store does not hold
            views.append(BundleView(bid, "?", "?", None, None, None, runs, damaged="not stored"))
        for (workflow, version), runs in sorted(legacy.items()):
            views.append(BundleView(None, workflow, version, None, None, None, runs))
        return views

    def waiting_for_worker(self, run: RunRecord, now: float | None = None) -> str | None:
        """Why a runnable run is not running, when it is that no live worker
        serves its bundle: ``"waiting for a worker serving bundle X ..."``."""
        if run.bundle is None or run.status not in (RunStatus.PENDING, RunStatus.SUSPENDED):
            return None
        now = time.time() if now is None else now
        if run.status is RunStatus.SUSPENDED and (run.wake_at is None or run.wake_at > now):
            return None  # not runnable yet: it waits for its timer, child or delivery
        record = self._stored_bundle(run)
        if record is not None and record.served_at is not None and now - record.served_at <= SERVED_RECENTLY:
            return None
        seen = "never served" if record is None or record.served_at is None else \
            f"last served {now - record.served_at:.0f}s ago"
        return (f"waiting for a worker serving bundle {run.bundle} ({run.workflow} version "
                f"{run.workflow_version}; {seen})")

    def migrate(self, run_id: str, bundle: BundleRecord, detail: dict[str, Any], *,
                checked_seq: int | None = None) -> Change:
        """Move run ``run_id`` to ``bundle``, recording ``detail`` (the replay
        check's finding, or the forced override's reason) and the actor;
        with ``checked_seq``, only if its history still ends there (the
        journal the check replayed)."""
        before = self.get_run(run_id)
        return Change(before, self._store.migrate_run(run_id, bundle, detail, actor=self.actor,
                                                      checked_seq=checked_seq))

    # -- maintenance -----------------------------------------------------------------------

    def prune(
        self,
        older_than_seconds: float,
        *,
        statuses: Collection[RunStatus | str] | None = None,
        batch_size: int = 1000,
        dry_run: bool = False,
    ) -> int:
        """Delete finished run trees last changed more than
        ``older_than_seconds`` ago, ``batch_size`` runs per transaction; return
        how many runs went (with ``dry_run``: would go). See ``App.prune``."""
        if older_than_seconds < 0:
            raise ValueError(f"older_than_seconds must not be negative, not {older_than_seconds}")
        cutoff = time.time() - older_than_seconds
        chosen = None if statuses is None else [RunStatus(status) for status in statuses]
        if dry_run:
            return self._store.prune_runs(cutoff, chosen, sys.maxsize, dry_run=True)
        total = 0
        self.sweep_memory(batch_size)  # expired memory first: its artifacts are collected below
        # the one run-deletion path, the retention controller's too (cairn.worker.retention)
        while pruned := self._store.prune_runs(cutoff, chosen, batch_size, actor=self.actor):
            total += pruned
        return total

    def erase(self, *, tenant: str = "default", subject: str | None = None, thread: str | None = None,
              dry_run: bool = False) -> Erasure:
        """Erase a subject, a thread or (neither given) a whole tenant: its
        unfinished runs killed, its subject keys destroyed (crypto-shredding),
        its runs and memory deleted, the freed space reclaimed, an erasure
        record kept without personal data, this operator as its actor (see
        ``cairn.api.erasure``). Interrupted, running it again completes it."""
        return erase_target(self._store, Target(tenant, subject, thread), actor=self.actor, dry_run=dry_run,
                            kill=lambda run_id: self._kill_runs(KILL_REASON, run_id, None))

    def erasures(self, tenant: str | None = None, *, limit: int = 100) -> list[ErasureRecord]:
        """The erasure records, newest first (of ``tenant``)."""
        return self._store.erasures(tenant, limit=limit)
    # -- tiers (issue 26 item 5): archived runs ------------------------------------------------

    def archivable(self, older_than_seconds: float, *, tenant: str | None = None, limit: int = 1000
                   ) -> list[str]:
        """The closed, hot runs last changed more than ``older_than_seconds`` ago, oldest first."""
        if older_than_seconds < 0:
            raise ValueError(f"older_than_seconds must not be negative, not {older_than_seconds}")
        _check_limit(limit)
        return self._store.archivable_runs(time.time() - older_than_seconds, tenant=tenant, limit=limit)

    def archive(self, older_than_seconds: float, *, tenant: str | None = None, limit: int = 1000) -> Archived:
        """Archive the runs ``archivable`` names, one at a time (each its own
        fenced move; a run that changed meanwhile is left hot and named)."""
        archived, skipped = [], []
        for run_id in self.archivable(older_than_seconds, tenant=tenant, limit=limit):
            try:
                archived.append(self.archive_run(run_id))
            except (InvalidRunState, RunNotFound) as exc:
                skipped.append((run_id, str(exc)))
        return Archived(archived, skipped)

    def archive_run(self, run_id: str) -> ArchiveRecord:
        """Archive closed run ``run_id`` (``Store.archive_run``), this operator its recorded actor."""
        return self._store.archive_run(run_id, actor=self.actor)

    def restore(self, run_id: str) -> ArchiveRecord:
        """Put archived run ``run_id`` back in the hot tables, bit for bit
        (``Store.restore_run``), this operator its recorded ``restored_by``."""
        return self._store.restore_run(run_id, actor=self.actor)

    def run_archive(self, run_id: str) -> ArchiveRecord | None:
        """Where run ``run_id`` is archived; ``None`` while it is hot."""
        return self._store.run_archive(run_id)
    @property
    def retention(self) -> Retention:
        """Retention policies per data class, and the controller on demand
        (``cairn.api.retention``), acting as this operator."""
        return Retention(self._store, self.actor)

    # -- memory (issue 14): introspection and deletion ---------------------------------------

    def memory(self, tenant: str) -> Memory:
        """``tenant``'s memory as this operator reads and writes it: every
        write is recorded with this operator as its actor."""
        return direct_memory(self._store, self.codec, self.memory_policy, tenant, self.actor)

    def memory_items(self, tenant: str | None, prefix: tuple[str, ...] = (), *, run_id: str | None = None,
                     limit: int = 100) -> list[Item]:
        """Live long-term items under ``prefix`` (of ``tenant``; ``None``: every tenant)."""
        _check_limit(limit)
        found = self._store.memory_items(tenant, encode_prefix(prefix), run_id=run_id, limit=limit)
        return [item_of(item, self.codec) for item in found]

    def memory_item(self, tenant: str, namespace: tuple[str, ...], key: str) -> Item | None:
        """One live item (an operator's read never refreshes its TTL)."""
        found = self._store.memory_item(tenant, encode_namespace(namespace), key)
        return None if found is None else item_of(found, self.codec)

    def thread_messages(self, tenant: str, thread_id: str, *, last: int | None = None,
                        limit: int = 1000) -> list[Message]:
        if last is not None:
            _check_limit(last)
        found = self._store.thread_messages(tenant, thread_id, last=last, limit=limit)
        return [message_of(message, self.codec) for message in found]

    def memory_threads(self, tenant: str | None, *, limit: int = 100) -> list[dict[str, Any]]:
        _check_limit(limit)
        return self._store.memory_threads(tenant, limit=limit)

    def run_memory(self, run_id: str) -> dict[str, Any]:
        """The run's own memory, key by key (``RunNotFound`` for an unknown run)."""
        self.get_run(run_id)
        return {entry.key: self.codec.load(entry.value, what=f"run memory {entry.key!r}")
                for entry in self._store.run_memory(run_id)}

    def search_memory(self, tenant: str, prefix: tuple[str, ...], query: str, *, k: int = 10,
                      filter: dict[str, Any] | None = None) -> SearchResult:
        _check_limit(k)
        return self.memory(tenant).search(prefix, query, k=k, filter=filter)

    def memory_tiers(self, tenant: str | None = None) -> list[TierUsage]:
        """The vectors of long-term memory and their bytes per tier (hot:
        float32; cold: int8), of ``tenant`` or every tenant the store sees."""
        return self._store.vector_tiers(tenant)

    def memory_item_tiers(self, tenant: str | None = None) -> list[ItemTierUsage]:
        """Long-term items and the bytes of their values per tier (hot: inline
        in the row; cold: compressed, ``MemoryPolicy(cold_after=)``), of
        ``tenant`` or every tenant the store sees."""
        return self._store.item_tiers(tenant)

    def tier_memory(self, idle_seconds: float | None = None) -> ItemTierMove:
        """Run a tiering pass of item values now (what ``cairn worker`` does
        every minute with ``cold_after``): values idle for ``idle_seconds``
        (default: the policy's ``cold_after``) go cold, touched ones come back."""
        idle = idle_seconds if idle_seconds is not None else self.memory_policy.cold_after
        if idle is None:
            raise InvalidArgument("no idle period: give one, or App(memory=MemoryPolicy(cold_after=...))")
        return ItemTiering(self._store, idle).tier()

    def delete_memory(self, tenant: str | None, *, namespace: tuple[str, ...] | None = None,
                      key: str | None = None, thread_id: str | None = None,
                      run_id: str | None = None) -> int:
        """Delete one item (``namespace`` + ``key``), a namespace prefix, a
        thread, everything a run wrote, or (nothing else given) all of
        ``tenant``'s memory, with outbox rows and vectors; offloaded values
        go at the next prune. Returns how many rows went. The deletion is
        logged with this operator as its actor (nothing of the memory is
        left to carry it)."""
        if key is not None:
            if namespace is None or not namespace:
                raise InvalidArgument("deleting one item needs its namespace")
            encoded: str | None = encode_namespace(namespace)
        else:
            encoded = None if namespace is None else encode_prefix(namespace)
        if run_id is not None:
            self.get_run(run_id)
        scope = MemoryScope(tenant, encoded, key, thread_id, run_id)
        deleted = self._store.delete_memory(scope)
        log.info("memory deleted by %s: %d rows (tenant=%r namespace=%r key=%r thread=%r run=%r)",
                 self.actor, deleted, tenant, namespace, key, thread_id, run_id)
        return deleted

    def sweep_memory(self, batch_size: int = 1000) -> int:
        """Delete expired memory (invisible already); how many rows went."""
        total = 0
        while swept := self._store.sweep_memory(batch_size):
            total += swept
        return total

    # -- signals and published events ------------------------------------------------------

    def signal(self, run_id: str, name: str, data: Any = None, *, dedupe: str | None = None) -> Sent:
        """Send signal ``name`` carrying ``data`` to run ``run_id``, recording
        this operator as its sender. Refused for an unknown (or another
        tenant's) run (``RunNotFound``) and for a finished one
        (``InvalidRunState``); ``dedupe`` makes a repeated send deliver once.
        The data is checked against the type the receiver expects when it is
        received (see ``cairn.InvalidSignal``): only the run knows it."""
        key = signal_key(name)
        payload, _ = self.codec.dump(data)
        delivery, created = self._store.deliver(run_id, key, payload, sender=self.actor, dedupe=dedupe)
        return Sent(delivery, created)

    def mailbox(self, run_id: str, key: str | None = None) -> list[Delivery]:
        """The messages delivered to run ``run_id`` (for wait ``key`` only, if
        given), consumed or not, in order of arrival."""
        self.get_run(run_id)
        return self._store.deliveries(run_id, key)

    def latest_event(self, run_id: str, key: str, type_: Any = Any) -> Published | None:
        """What run ``run_id`` published last under ``key``, now (``None``: nothing)."""
        check_name("an event key", key)
        event = self._store.latest_event(run_id, key)
        if event is None:
            return None
        raw = self.codec.raw(event.payload, what=f"event {key!r}") if event.payload is not None else b"null"
        value = values.decode(raw, type_, what=f"event {key!r} of run {run_id!r}")
        return Published(run_id, key, value, event.seq, event.at)

    def get_event(self, run_id: str, key: str, *, timeout: float = 0.0, type_: Any = Any) -> Published | None:
        """The latest value run ``run_id`` published under ``key``; if there
        is none yet, wait up to ``timeout`` seconds for one (``None`` if none
        came, or the run finished without). Polls the store with a backoff
        from 5 ms to 250 ms: no busy loop (a minute of waiting costs about
        250 reads), and a value published is seen within a quarter second."""
        check_name("an event key", key)
        deadline = time.monotonic() + max(0.0, timeout)
        delay = 0.005
        while True:
            # The run first: if it is finished, the read after it sees all it published.
            run = self.get_run(run_id)
            found = self.latest_event(run_id, key, type_)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0 or run.status.terminal:
                return None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.25)

    # -- the store calls that record the actor ----------------------------------------------
    # One helper per store action, so that passing ``actor=self.actor`` (the
    # store's keyword, recorded in the entry's detail) is one line each.

    def _cancel_run(self, run_id: str, reason: str) -> RunRecord:
        return self._store.cancel_run(run_id, reason, actor=self.actor)

    def _kill_runs(self, reason: str, run_id: str | None, tenant: str | None) -> list[RunRecord]:
        return self._store.kill_runs(reason, run_id=run_id, tenant=tenant, actor=self.actor)

    def _retry_run(self, run_id: str) -> RunRecord:
        return self._store.retry_run(run_id, actor=self.actor)

    def _revive_run(self, run_id: str) -> RunRecord:
        return self._store.revive_run(run_id, actor=self.actor)

    def _set_budget(self, run_id: str, budget: dict[str, Any]) -> RunRecord:
        return self._store.set_budget(run_id, budget, actor=self.actor)

    def _resolve_operation(
        self, run_id: str, position: int, done: bool, result: Payload | None, detail: dict[str, Any]
    ) -> RunRecord:
        return self._store.resolve_operation(run_id, position, done, result, detail, actor=self.actor)


# -- the database schema (``cairn db``) ---------------------------------------------------------


class Schema:
    """A database opened without applying migrations, to report on its schema
    and migrate it (``cairn db status`` / ``cairn db migrate``)."""

    def __init__(self, store: Store, dialect: str) -> None:
        assert isinstance(store, Migratable)
        self._store = store
        #: ``sqlite`` or ``postgres``: which migrations apply
        self.dialect = dialect

    def version(self) -> int:
        return self._store.schema_version()

    def migrate(self) -> list[int]:
        """Apply the pending migrations; return the versions applied."""
        return self._store.migrate()

    def close(self) -> None:
        self._store.close()


def open_for_inspection(db: str | None) -> tuple[Store, str | None]:
    """Open the database ``db`` for commands that only read it (``runs``,
    ``show``, ``events``, ``ops list``, ``queues list``): read-only, never
    created, never migrated, so a reader neither waits for a writer's lock
    nor changes the file. Returns the store and, when the database lacks
    migrations this version has, a one-line notice saying so (reading goes
    on; a read the old schema cannot answer fails naming the cause)."""
    store = open_store(db, create=False, read_only=True)
    return store, _pending_notice(store, dialect(db))


def _pending_notice(store: Store, kind: str) -> str | None:
    if not isinstance(store, Migratable):
        return None
    try:
        version = store.schema_version()
    except Exception:
        store.close()
        raise
    latest = len(load_migrations(kind))
    if version >= latest:
        return None
    return (f"note: the database's schema is at version {version}, this Cairn's is {latest}: "
            f"{latest - version} migration(s) pending; run 'cairn db migrate' (nothing was changed)")


def open_schema(db: str | None, *, create: bool) -> Schema:
    """The schema of the database ``db``; ``create=False`` refuses a SQLite
    file that does not exist and opens it read-only (``cairn db status``
    only reports: it must not wait for a worker's write lock). ``ValueError``
    for a ``memory://`` store, which lives inside one process and has no
    schema to manage."""
    kind = dialect(db)
    if kind == "memory":
        raise ValueError("a memory:// store lives inside one process and has no schema to manage")
    store = open_store(db, create=create, migrate=False, read_only=not create)
    if not isinstance(store, Migratable):  # every backend URL names a SQL store today
        store.close()
        raise ValueError(f"a {kind} store has no schema to manage")
    return Schema(store, kind)


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise InvalidArgument(f"a limit must be at least 1, not {limit}")
