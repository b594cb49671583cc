"""The run state machine, as pure functions: every rule of a run's life, once.

Each transition is a function from the rows a backend reads (a run's
record, its claim state, its live descendants) and the caller's arguments to
what the backend must do: the change to the run row (``RunUpdate``), the
history entries to append, or the error to raise. Backends only read the
inputs inside their transaction and apply the outputs, so every backend
decides identically, and the messages and entry details people and tools
read are written here and nowhere else. (``admission.plan`` does the same for
which runnable runs a claim takes.)

Entries returned with ``seq=0`` go after the run's current last entry (the
backend numbers them as it appends, holding the run's row); entries of a
claim carry their ``seq``, computed from the history the claim read.

An ``actor`` (who did it: ``"cli:root@host"``, ``"app"``) is recorded as
``"actor"`` in the detail of the entry an operator transition appends; it is
left out when unknown, so histories written without one read as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cairn.errors import (
    ApprovalClosed,
    ApprovalNotFound,
    InvalidArgument,
    InvalidRunState,
    NotAnApprover,
    PayloadError,
    RunIdTaken,
    RunNotFound,
    StoreError,
)
from cairn.store.records import (
    DECISIONS,
    Approval,
    ApprovalStatus,
    BundleRecord,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunRecord,
    RunStatus,
    approval_key,
)
from cairn.store.retention import Cutoffs
from cairn.store.runids import check_run_id

#: The terminal statuses as stored (for statements that test them).
TERMINAL = tuple(status.value for status in RunStatus if status.terminal)

_KNOWN_STATUSES = frozenset(RunStatus)

#: What ``prune_runs`` deletes unless told otherwise: runs that ended for
#: good. ``quarantined``, ``killed`` and ``halted`` runs are terminal too, but
#: they wait for an operator's decision (retry or revive), so they are pruned
#: only when asked for by name.
DEFAULT_PRUNE_STATUSES: tuple[RunStatus, ...] = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


# -- what a transition produces ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunUpdate:
    """A change to one run row, applied by the dialect statement named
    ``statement`` (the same name in every dialect's ``queries.sql``), which
    sets the columns that transition sets (``cancel``: status ``cancelled``,
    no owner or lease, epoch + 1, ...). ``epoch`` is the run's epoch after
    the change (the statement bumps it itself; the backend holds the row, so
    the two agree); ``error``, ``budget`` and ``recoveries`` are the values
    the statement writes, where it writes them. Every update statement
    returns the run's row as it is after the change."""

    statement: str
    run_id: str
    at: float
    epoch: int
    error: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    recoveries: int | None = None
    fence: int | None = None  # a fenced update applies only to the run held at this epoch
    bundle: str | None = None  # ``migrate``: the run's new bundle and workflow version
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One run's change: its row update, the entries to append after its
    history's last one, and whether a parent suspended waiting on it must
    become runnable (``wakes_parent``)."""

    update: RunUpdate
    entries: tuple[HistoryEvent, ...]
    wakes_parent: bool = False


def entry(
    run_id: str,
    event: EventType,
    at: float,
    epoch: int,
    worker: str | None = None,
    detail: dict[str, Any] | None = None,
    seq: int = 0,
) -> HistoryEvent:
    """A lifecycle entry (no position, no payload); ``seq=0``: after the last."""
    return HistoryEvent(run_id=run_id, seq=seq, event=event, at=at, epoch=epoch, worker=worker, detail=detail)


def _by(detail: dict[str, Any], actor: str | None) -> dict[str, Any]:
    if actor is not None:
        detail["actor"] = actor
    return detail


def _found(run: RunRecord | None, run_id: str) -> RunRecord:
    if run is None:
        raise RunNotFound(run_id)
    return run


# -- creating runs ------------------------------------------------------------------


def created_detail(run: NewRun) -> dict[str, Any]:
    """The detail of a ``run.created`` entry."""
    detail: dict[str, Any] = {"workflow": run.workflow, "version": run.workflow_version, "tenant": run.tenant}
    if run.parent_run_id:
        detail["parent_run_id"] = run.parent_run_id
    if run.origin is not None:
        detail["forked_from"] = run.origin
    if run.started_role is not None:  # shown; authorization reads the row (engine.startedwith)
        detail["started_role"] = run.started_role
        if run.started_token is not None:
            detail["started_token"] = run.started_token
    if run.started_by is not None:
        detail["started_by"] = run.started_by
    return detail


def unstorable_text(exc: UnicodeError) -> InvalidArgument:
    """The error for text no database can hold, met while binding a
    statement's parameters: a lone surrogate, which is what Python makes of a
    command-line argument that is not UTF-8 (or of a JSON escape like
    ``\\ud800``). The same on every backend, and nothing was written."""
    return InvalidArgument(f"text that is not valid Unicode cannot be stored or looked up ({exc})")


def nul_text() -> InvalidArgument:
    """The error for text holding a NUL character, which PostgreSQL's text
    cannot hold (met while binding a statement's parameters): bad input,
    never a database failure, and nothing was written. (Ids refuse it on
    every backend: ``runids.check_id``.)"""
    return InvalidArgument("text holding a NUL character (U+0000) cannot be stored or looked up")


def id_taken(run_id: str) -> InvalidRunState:
    """The error for creating a run whose id a run this store cannot read
    holds (another tenant's, under row-level security). It names no tenant
    and is the same whoever holds the id: "taken" is all a caller learns."""
    return InvalidRunState(f"run id {run_id!r} is already taken: choose another")


def existing_child(existing: RunRecord | None, child: NewRun) -> RunRecord:
    """The run already under ``child``'s id when a parent starts it: that run
    if it is this very child (same parent, same tenant), else ``RunIdTaken``,
    raised inside the transaction so that the parent's entry is not written.
    ``None`` is a run this store cannot read (another tenant's, under
    row-level security). The error is the same whoever holds the id."""
    if existing is None or existing.parent_run_id != child.parent_run_id or existing.tenant != child.tenant:
        raise RunIdTaken(f"run id {child.run_id!r} is already taken: choose another")
    return existing


def create(run: NewRun, now: float) -> HistoryEvent:
    """The first entry of a new ``pending`` run (epoch 0); an id in the
    reserved ``schedule:`` namespace that is not this tenant's is refused
    (``runids.check_run_id``)."""
    check_run_id(run.run_id, run.tenant)
    return entry(run.run_id, EventType.RUN_CREATED, now, 0, None, created_detail(run), seq=1)


def create_claimed(run: NewRun, worker: str, now: float, lease_seconds: float) -> list[HistoryEvent]:
    """The history of a run created already held by ``worker`` at epoch 1:
    created, claimed until ``now + lease_seconds``, started (its id checked as ``create`` does)."""
    check_run_id(run.run_id, run.tenant)
    until = now + lease_seconds
    return [
        entry(run.run_id, EventType.RUN_CREATED, now, 1, None, created_detail(run), seq=1),
        entry(run.run_id, EventType.LEASE_CLAIMED, now, 1, worker, {"lease_until": until}, seq=2),
        entry(run.run_id, EventType.RUN_STARTED, now, 1, worker, None, seq=3),
    ]


# -- claims, takeovers, quarantine ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimState:
    """A runnable run's row as a claim reads it, holding it."""

    run_id: str
    status: RunStatus
    owner: str | None
    epoch: int
    recoveries: int


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """What claiming one run does. ``quarantine`` is set (and the run not
    claimed) when a takeover exceeded ``max_recoveries``; otherwise the run
    becomes ``running`` under the claimer at ``epoch`` until ``lease_until``
    with ``recoveries``. ``entries`` carry their ``seq``."""

    run_id: str
    epoch: int
    lease_until: float
    recoveries: int
    entries: tuple[HistoryEvent, ...]
    quarantine: RunUpdate | None = None

    @property
    def claimed(self) -> bool:
        return self.quarantine is None


def damaged_error(run_id: str, damage: str) -> dict[str, Any]:
    """The error of a run quarantined because one of its rows cannot be read."""
    return {"type": "DamagedRow",
            "message": f"run {run_id!r} was quarantined: its stored data is damaged ({damage}); "
                       "repair the row, then retry the run"}


def quarantine_damaged(run_id: str, epoch: int, recoveries: int, damage: str, now: float) -> Transition:
    """Quarantine a run just claimed at ``epoch`` whose own row turned out
    damaged (``damage``: which column, why) when read back: the claim stays
    in its history, the run goes to an operator instead of to a worker."""
    error = damaged_error(run_id, damage)
    return Transition(RunUpdate("quarantine", run_id, now, epoch + 1, error=error, recoveries=recoveries),
                      (entry(run_id, EventType.RUN_QUARANTINED, now, epoch + 1, None, error),))


def claim(
    state: ClaimState, last_seq: int, worker: str, now: float, lease_seconds: float, max_recoveries: int,
    damage: str | None = None,
) -> ClaimOutcome:
    """Claim a runnable run whose history ends at ``last_seq``.

    A ``running`` run is a takeover (its lease expired): ``lease.lost``
    names the old holder, recoveries grow by one, and past
    ``max_recoveries`` the run is quarantined instead (``run.quarantined``).
    Otherwise ``lease.claimed`` (or ``lease.taken_over``), then
    ``run.started`` the first time a run is claimed, ``run.woken`` after a
    suspension.

    A run that cannot be read (``damage`` says what: a history row that does
    not parse, or a status this version does not know) is quarantined at
    once, its recoveries untouched: executing it would replay a journal
    that is not there, and failing the whole claim would stop every other
    run behind it."""
    run_id, old_epoch, old_owner = state.run_id, state.epoch, state.owner
    until = now + lease_seconds
    epoch = old_epoch + 1
    entries: list[HistoryEvent] = []

    def add(event: EventType, at_epoch: int, by: str | None, detail: dict[str, Any] | None) -> None:
        entries.append(entry(run_id, event, now, at_epoch, by, detail, seq=last_seq + len(entries) + 1))

    if damage is None and state.status not in _KNOWN_STATUSES:
        damage = f"unknown status {state.status.value[1:]!r}"
    if damage is not None:
        error = damaged_error(run_id, damage)
        add(EventType.RUN_QUARANTINED, epoch, None, error)
        update = RunUpdate("quarantine", run_id, now, epoch, error=error, recoveries=state.recoveries)
        return ClaimOutcome(run_id, epoch, until, state.recoveries, tuple(entries), update)

    recoveries = state.recoveries
    takeover = state.status is RunStatus.RUNNING
    if takeover:
        recoveries += 1
        lost = {"worker": old_owner, "epoch": old_epoch, "reason": "expired"}
        add(EventType.LEASE_LOST, old_epoch, old_owner, lost)
        if recoveries > max_recoveries:
            error = {"type": "Quarantined",
                     "message": f"run lost its worker {recoveries} times (limit {max_recoveries})"}
            add(EventType.RUN_QUARANTINED, epoch, None, error)
            update = RunUpdate("quarantine", run_id, now, epoch, error=error, recoveries=recoveries)
            return ClaimOutcome(run_id, epoch, until, recoveries, tuple(entries), update)
        add(EventType.LEASE_TAKEN_OVER, epoch, worker, {"from_worker": old_owner, "lease_until": until})
    else:
        add(EventType.LEASE_CLAIMED, epoch, worker, {"lease_until": until})
        if state.status is RunStatus.PENDING and old_epoch == 0:
            add(EventType.RUN_STARTED, epoch, worker, None)
        elif state.status is RunStatus.SUSPENDED:
            add(EventType.RUN_WOKEN, epoch, worker, None)
    return ClaimOutcome(run_id, epoch, until, recoveries, tuple(entries))


# -- fenced transitions of the lease holder -------------------------------------------


def check_suspend_status(status: RunStatus) -> None:
    if status not in (RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION, RunStatus.INCOMPATIBLE):
        raise ValueError(f"suspend_run parks a run as suspended or needs_attention (or incompatible), "
                         f"not {status}")


def suspended_runnable_at(
    status: RunStatus, wake_at: float | None, waiting_on: str | None, child_status: str | None, now: float,
    waiting_for: str | None = None, delivered: bool = False,
) -> float | None:
    """When a run parked by ``suspend_run`` becomes claimable again:
    ``needs_attention`` never by itself (an operator resolves it); waiting
    on a child, at once if the child (``child_status``, as stored; ``None``
    if absent) is terminal already, else when it ends; waiting for a
    delivery (``waiting_for``), at once if one is in the mailbox already
    (``delivered``: it arrived while the run was deciding to wait), else
    when it arrives or at ``wake_at`` (its timeout), whichever is first;
    otherwise at ``wake_at`` (``None``: a budget suspension, until
    ``set_budget``)."""
    if status is not RunStatus.SUSPENDED:
        return None
    if waiting_on is not None:
        return now if child_status in TERMINAL else None
    if waiting_for is not None and delivered:
        return now
    return wake_at


def check_wait(waiting_on: str | None, waiting_for: str | None) -> None:
    if waiting_on is not None and waiting_for is not None:
        raise ValueError("a run waits for a child or for a delivery, not both")


def check_deliverable(run: RunRecord | None, run_id: str, key: str) -> RunRecord:
    """A delivery (a signal, a decision) goes only to a run that can still
    consume it: an unknown run (or another tenant's: the store cannot see it)
    is ``RunNotFound``, a terminal one ``InvalidRunState``. A ``failed`` run
    may be retried, but what it would read on retry is decided then: it
    refuses deliveries like every terminal run rather than keep them for a
    retry that may never come."""
    run = _found(run, run_id)
    if run.status.terminal:
        raise InvalidRunState(f"run {run_id!r} is {run.status.value}: it takes no more deliveries "
                              f"({wait_label(key)})")
    return run


def already_taken(run_id: str, seq: int) -> StoreError:
    return StoreError(f"message {seq} of run {run_id!r} is consumed already: a message is consumed once")


def wait_label(key: str) -> str:
    """A wait key as people read it: ``signal:go`` is ``signal 'go'``."""
    kind, _, name = key.partition(":")
    return f"{kind} {name!r}" if name else repr(key)


def check_finish_status(status: RunStatus) -> None:
    if status not in (RunStatus.COMPLETED, RunStatus.FAILED):
        raise ValueError(f"finish_run takes completed or failed, not {status}")


def halt(run_id: str, epoch: int, error: dict[str, Any], now: float) -> RunUpdate:
    """A security failure stops the run held at ``epoch``: ``halted``."""
    return RunUpdate("halt", run_id, now, epoch + 1, error=error, fence=epoch)


def child_of(child: NewRun, parent_run_id: str) -> NewRun:
    """``child`` with its parent set to ``parent_run_id``."""
    return child if child.parent_run_id == parent_run_id else replace(child, parent_run_id=parent_run_id)


# -- operator transitions (bump the epoch) ----------------------------------------------


def cancel(
    run: RunRecord | None, run_id: str, live: Sequence[tuple[str, int]], reason: str, now: float,
    actor: str | None = None,
) -> list[Transition]:
    """Cancel ``run_id`` and its non-terminal descendants ``live`` (each
    ``(run_id, epoch)`` as read holding it; a terminal run is not among them
    and stays as it is)."""
    _found(run, run_id)
    error = {"type": "Cancelled", "message": reason}
    return [
        Transition(
            RunUpdate("cancel", rid, now, epoch + 1, error=error),
            (entry(rid, EventType.RUN_CANCELLED, now, epoch + 1, None, _by({"reason": reason}, actor)),),
            wakes_parent=True,
        )
        for rid, epoch in live
    ]


def check_kill_target(run_id: str | None, tenant: str | None) -> None:
    if (run_id is None) == (tenant is None):
        raise ValueError("kill_runs takes exactly one of run_id and tenant")


def kill(
    run: RunRecord | None, run_id: str | None, live: Sequence[tuple[str, int]], reason: str, now: float,
    actor: str | None = None,
) -> list[Transition]:
    """The kill switch over ``live`` runs (``(run_id, epoch)``): the tree of
    ``run_id`` (which must exist) or every live run of a tenant."""
    if run_id is not None:
        _found(run, run_id)
    error = {"type": "Killed", "message": reason}
    return [
        Transition(
            RunUpdate("kill", rid, now, epoch + 1, error=error),
            (entry(rid, EventType.RUN_KILLED, now, epoch + 1, None, _by({"reason": reason}, actor)),),
            wakes_parent=True,
        )
        for rid, epoch in live
    ]


def retry(
    run: RunRecord | None, run_id: str, last_failed_position: int | None, now: float, actor: str | None = None
) -> Transition:
    """A ``failed`` or ``quarantined`` run becomes ``pending`` again; replay
    resumes before the last failed step (``from_position``). An
    ``incompatible`` run too, replaying its whole journal (nothing failed:
    the code could not read a payload; an upcaster deployed since may)."""
    run = _found(run, run_id)
    if run.status not in (RunStatus.FAILED, RunStatus.QUARANTINED, RunStatus.INCOMPATIBLE):
        raise InvalidRunState(f"run {run_id!r} is {run.status.value}; only failed or "
                              "quarantined runs can be retried (and incompatible ones)")
    if run.status is RunStatus.INCOMPATIBLE:
        last_failed_position = None
    detail = _by({"from_position": last_failed_position, "previous_status": run.status.value}, actor)
    epoch = run.epoch + 1
    return Transition(RunUpdate("retry", run_id, now, epoch),
                      (entry(run_id, EventType.RUN_RETRIED, now, epoch, None, detail),))


def revive(run: RunRecord | None, run_id: str, now: float, actor: str | None = None) -> Transition:
    """A ``killed`` or ``halted`` run becomes ``pending`` again."""
    run = _found(run, run_id)
    if run.status not in (RunStatus.KILLED, RunStatus.HALTED):
        raise InvalidRunState(f"run {run_id!r} is {run.status.value}; only killed or halted runs "
                              "can be revived")
    epoch = run.epoch + 1
    detail = _by({"previous_status": run.status.value}, actor)
    return Transition(RunUpdate("reopen", run_id, now, epoch),
                      (entry(run_id, EventType.RUN_REVIVED, now, epoch, None, detail),))


def set_budget(
    run: RunRecord | None, run_id: str, budget: dict[str, Any], now: float, actor: str | None = None
) -> Transition:
    """New budget limits for a run that is not ``running`` (its holder read
    the old ones) and may still run (a completed or cancelled run never
    will: a new budget there would only mislead); the epoch stays, a budget
    suspension ends."""
    run = _found(run, run_id)
    if run.status is RunStatus.RUNNING:
        raise InvalidRunState(f"run {run_id!r} is running; change its budget once it is suspended")
    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        raise InvalidRunState(f"run {run_id!r} is {run.status.value} and will not run again; its budget "
                              "cannot change")
    detail = _by({"budget": budget}, actor)
    return Transition(RunUpdate("set_budget", run_id, now, run.epoch, budget=budget),
                      (entry(run_id, EventType.RUN_BUDGET_CHANGED, now, run.epoch, None, detail),))


def migrate(
    run: RunRecord | None, run_id: str, bundle: BundleRecord, detail: dict[str, Any], now: float,
    actor: str | None = None, journal: tuple[int, int] | None = None,
) -> Transition:
    """An operator moves a run to another bundle of its workflow (``cairn
    migrate``). Not while it is ``running`` (its holder executes the old
    code: the move would take effect under it); not once it is
    ``completed`` or ``cancelled`` (it will never run again). The journal
    stays as it is; the entry records both bundles, the actor and
    ``detail`` (the replay check, or the reason of a forced move). The
    epoch stays: no holder is there to fence out. ``journal``: the last
    seq of the history the replay check read, and the run's last seq now;
    they must be equal (the run woke and wrote more in between: the check
    no longer speaks for it)."""
    run = _found(run, run_id)
    if run.status is RunStatus.RUNNING:
        raise InvalidRunState(f"run {run_id!r} is running; migrate it once it is suspended or stopped")
    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        raise InvalidRunState(f"run {run_id!r} is {run.status.value} and will not run again; it cannot be "
                              "migrated")
    if bundle.workflow != run.workflow:
        raise InvalidRunState(f"bundle {bundle.bundle_id!r} is of workflow {bundle.workflow!r}, not of "
                              f"run {run_id!r}'s workflow {run.workflow!r}")
    if journal is not None and journal[0] != journal[1]:
        raise InvalidRunState(f"run {run_id!r} was not migrated: its journal changed since the replay check "
                              f"(checked up to entry {journal[0]}, now {journal[1]}); check it again")
    full = _by({"from_bundle": run.bundle, "to_bundle": bundle.bundle_id,
                "from_version": run.workflow_version,
                "to_version": bundle.version, **detail}, actor)
    return Transition(RunUpdate("migrate", run_id, now, run.epoch, bundle=bundle.bundle_id,
                                version=bundle.version),
                      (entry(run_id, EventType.RUN_MIGRATED, now, run.epoch, None, full),))


def resolve_operation(
    run: RunRecord | None,
    run_id: str,
    position: int,
    done: bool,
    result: Payload | None,
    detail: dict[str, Any],
    now: float,
    actor: str | None = None,
) -> Transition:
    """An operator settles the uncertain operation at ``position`` of a
    ``needs_attention`` run, which becomes ``pending``: done (a
    ``step.completed`` holding ``result``) or not (``op.resolved``: execute
    again)."""
    run = _found(run, run_id)
    if run.status is not RunStatus.NEEDS_ATTENTION:
        raise InvalidRunState(f"run {run_id!r} is {run.status.value}; only runs that need "
                              "attention have operations to resolve")
    epoch = run.epoch + 1
    kind, name = detail.get("step_kind", "tool"), detail.get("name")
    if done:
        resolved = HistoryEvent(
            run_id=run_id, seq=0, event=EventType.STEP_COMPLETED, at=now, epoch=epoch, position=position,
            step_kind=kind, name=name, payload=result,
            detail=_by({"resolved_by": "operator", **detail}, actor),
        )
    else:
        resolved = HistoryEvent(
            run_id=run_id, seq=0, event=EventType.OP_RESOLVED, at=now, epoch=epoch, position=position,
            step_kind=kind, name=name, detail=_by({"position": position, "done": False, **detail}, actor),
        )
    return Transition(RunUpdate("reopen", run_id, now, epoch), (resolved,))


# -- damaged data ---------------------------------------------------------------------------


def check_artifact_name(ref: str) -> None:
    """``PayloadError`` unless ``ref`` is an artifact name: 64 lower hex
    digits (a SHA-256, or a sealed store's keyed address), never a path."""
    if len(ref) != 64 or any(c not in "0123456789abcdef" for c in ref):
        raise PayloadError(f"malformed artifact reference {ref[:80]!r}")


def check_artifact(ref: str, data: bytes, where: str) -> None:
    """``PayloadError`` unless ``data`` is what artifact ``ref`` names (its
    SHA-256): an artifact edited or damaged where it is kept is refused,
    never returned as the value that was stored."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != ref:
        raise PayloadError(f"artifact {ref} in {where} is damaged: its bytes hash to {digest[:16]}..., "
                           "not to its name")


# -- pruning -------------------------------------------------------------------------------


def prune_statuses(statuses: Collection[RunStatus] | None) -> frozenset[RunStatus]:
    """The statuses ``prune_runs`` may delete: ``statuses`` (default
    ``DEFAULT_PRUNE_STATUSES``), checked to be terminal."""
    chosen = frozenset(RunStatus(s) for s in (DEFAULT_PRUNE_STATUSES if statuses is None else statuses))
    live = sorted(s.value for s in chosen if not s.terminal)
    if live:
        raise ValueError(f"only finished runs can be pruned, not {', '.join(live)} ones")
    return chosen


def check_prune_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"prune limit must be at least 1, not {limit}")


def choose_trees(
    roots: Sequence[str],
    trees: Mapping[str, Sequence[TreeRow]],
    statuses: Collection[RunStatus],
    older_than: float | Cutoffs,
    limit: int,
    chosen: list[str],
) -> bool:
    """Add to ``chosen`` the runs ``prune_runs`` deletes from candidate
    ``roots`` (oldest first; ``trees`` maps each to its tree as
    ``(run_id, status, updated_at, tenant, workflow)`` rows); return whether
    the batch is full, that is whether later roots must not be looked at.

    A tree qualifies when every run in it has one of ``statuses`` and
    ``updated_at < older_than``; with retention ``Cutoffs``, when every run
    in it is due under the history policy of its own tenant and workflow
    (a tree goes whole: a run a policy keeps keeps its tree). Trees are taken whole, in order, while they
    fit in ``limit`` runs; the first qualifying tree is always taken, so a
    tree larger than the limit is still pruned (alone) and pruning always
    makes progress.
    """
    allowed = {s.value for s in statuses}
    for root in roots:
        tree = trees.get(root, ())
        if not tree or not all(str(row[1]) in allowed and _due(older_than, row) for row in tree):
            continue
        if chosen and len(chosen) + len(tree) > limit:
            return True
        chosen.extend(row[0] for row in tree)
        if len(chosen) >= limit:
            return True
    return False


#: A candidate root as ``select_prune_roots`` reads it: ``(run_id, updated_at)``.
RootRow = tuple[str, float]
#: A member of a tree as ``select_trees`` reads it: ``(run_id, status, updated_at, tenant, workflow)``.
TreeRow = tuple[str, str, float, str, str]
#: Trees as ``select_trees`` reads them: root -> ``(run_id, status, updated_at, tenant, workflow)`` rows.
Trees = Mapping[str, Sequence[TreeRow]]


def prune_cutoff(older_than: float | Cutoffs) -> float | None:
    """The cutoff the candidate roots are read with: ``older_than``, or the
    latest of the retention policies' (``None``: no policy deletes anything)."""
    return older_than.latest if isinstance(older_than, Cutoffs) else older_than


def prune_page_size(limit: int) -> int:
    """Rows read per query while pruning: enough for a batch of ``limit``
    single-run trees, bounded so a huge limit (a dry run counting
    everything) does not read the whole table at once."""
    return min(max(limit, 64), 1000)


def select_prunable(
    roots_after: Callable[[float | None, str, int], Sequence[RootRow]],
    trees_of: Callable[[Sequence[str]], Trees],
    statuses: Collection[RunStatus],
    older_than: float | Cutoffs,
    limit: int,
) -> tuple[list[str], list[str]]:
    """The roots and the runs ``prune_runs`` deletes now: whole qualifying
    trees, oldest root first, about ``limit`` runs (``choose_trees``).
    ``roots_after(at, run_id, page)`` reads the next page of candidate roots
    after that keyset (``None``: from the start), ``trees_of(roots)`` their
    trees: the walk is the same in every dialect, only the reads differ."""
    chosen: list[str] = []
    taken_roots: list[str] = []
    if prune_cutoff(older_than) is None:
        return taken_roots, chosen
    after: tuple[float | None, str] = (None, "")
    page = prune_page_size(limit)
    while True:
        rows = roots_after(after[0], after[1], page)
        if not rows:
            break
        after = (rows[-1][1], rows[-1][0])
        roots = [row[0] for row in rows]
        before = len(chosen)
        full = choose_trees(roots, trees_of(roots), statuses, older_than, limit, chosen)
        taken = set(chosen[before:])
        taken_roots += [root for root in roots if root in taken]
        if full or len(rows) < page:
            break
    return taken_roots, chosen


def _due(older_than: float | Cutoffs, row: TreeRow) -> bool:
    if isinstance(older_than, Cutoffs):
        return older_than.due(row[3], row[4], row[2])
    return row[2] < older_than


# -- approvals ---------------------------------------------------------------------------------


def approver_matches(approver: str, actor: str) -> bool:
    """Whether ``actor`` (an acting identity: ``cli:ada@host``, ``app:4242``,
    ``http:ada#<token id>``) is the one ``approver`` names, matched exactly:
    the identity itself, or, for an approver without a ``:`` (a bare name
    such as ``ada``), the operating-system user of that name at the CLI on
    any host (``cli:ada@laptop``; not ``cli:ada@mallory@laptop``).

    A bare name never matches an API token: a token's name is free text
    that the tenant's admin, the very one an approver rule restrains, mints
    at will (``ada``, ``ada@mallory``). A token approves only when named by
    its whole identity, whose id the installation assigns at random."""
    if approver == actor:
        return True
    if ":" in approver or not actor.startswith("cli:"):
        return False
    user, at, _host = actor.removeprefix("cli:").rpartition("@")
    return bool(at) and user == approver


def rewind_cut(rewound: HistoryEvent) -> int:
    """The position a ``run.rewound`` entry cuts the journal at: its outcomes
    from there on are void, and so are the approval requests made there
    (``Store.rewind_run``)."""
    cut = (rewound.detail or {}).get("from_position") if rewound.event is EventType.RUN_REWOUND else None
    if not isinstance(cut, int) or isinstance(cut, bool) or cut < 0:
        raise ValueError(f"not a run.rewound entry with a from_position: {rewound.event} {rewound.detail}")
    return cut


def check_decision(
    run: RunRecord | None, run_id: str, approval: Approval | None, request_id: str,
    status: ApprovalStatus, actor: str, now: float,
) -> Approval:
    """May ``actor`` decide ``status`` on request ``request_id`` of run
    ``run_id`` now? The run must exist and take deliveries (not finished);
    the request must exist, be pending and not past its expiry, and
    ``actor`` must be one of its approvers (when it names any). Raises the
    error that says which rule failed; nothing is stored then."""
    if status not in DECISIONS:
        raise ValueError(f"a decision is approved, rejected or edited, not {status}")
    check_deliverable(run, run_id, approval_key(request_id))
    if approval is None:
        raise ApprovalNotFound(run_id, request_id)
    what = f"approval request {request_id!r} of run {run_id!r} ({approval.action!r})"
    if approval.status is ApprovalStatus.VOIDED:
        raise ApprovalClosed(f"{what} was voided: its run was rewound past the request before anyone "
                             "decided, and asks again under a new request id")
    if approval.status is not ApprovalStatus.PENDING:
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        raise ApprovalClosed(f"{what} is {approval.status.value}{by} already: a request is decided once")
    if approval.expires_at is not None and now >= approval.expires_at:
        raise ApprovalClosed(f"{what} expired: its timeout passed undecided")
    if approval.approvers is not None and not any(approver_matches(a, actor) for a in approval.approvers):
        raise NotAnApprover(f"{actor} may not decide {what}: its approvers are "
                            f"{', '.join(approval.approvers) or 'nobody'}")
    return approval
