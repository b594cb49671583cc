"""Plain records exchanged between the engine and a store backend.

The store speaks only in these dataclasses (never changed once built; all but
the two built on every step are frozen) and in bytes: it never sees user
objects, so every backend stores exactly what the codec layer produced.
Times are Unix seconds as floats (``time.time()``), the same on every backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple

from cairn.errors import InvalidArgument
from cairn.store.runids import check_id


class RunStatus(enum.StrEnum):
    """Where a run is in its life. Terminal statuses never change again, except
    that ``failed`` and ``quarantined`` runs may be retried by an operator."""

    PENDING = "pending"  # runnable, waiting for a worker
    RUNNING = "running"  # held by a worker under a lease
    SUSPENDED = "suspended"  # waiting for a timer, a child or a budget raise; holds no worker
    NEEDS_ATTENTION = "needs_attention"  # an uncertain side effect an operator must resolve
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    QUARANTINED = "quarantined"  # crashed its worker too often; needs an operator
    KILLED = "killed"  # stopped by the kill switch; resumes only when forced
    HALTED = "halted"  # a security failure: stopped at once, never retried automatically
    #: a recorded payload has no path to its type's current version (``codec.upcasters``);
    #: parked, never retried by itself: ``cairn retry`` resumes it once an upcaster is deployed
    INCOMPATIBLE = "incompatible"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.QUARANTINED,
        RunStatus.KILLED,
        RunStatus.HALTED,
    }
)


class EventType(enum.StrEnum):
    """The kinds of entry in a run's history (its single ordered event stream).

    Journal entries (what replay reads) are the ``step.*`` entries that carry a
    position; everything else is lifecycle information for people and tools.
    """

    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    RUN_SUSPENDED = "run.suspended"
    RUN_WOKEN = "run.woken"
    RUN_RELEASED = "run.released"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_RETRIED = "run.retried"
    RUN_QUARANTINED = "run.quarantined"
    RUN_NEEDS_ATTENTION = "run.needs_attention"
    RUN_KILLED = "run.killed"
    RUN_REVIVED = "run.revived"
    RUN_HALTED = "run.halted"
    RUN_REWOUND = "run.rewound"  # a logical failure sent the run back to an earlier step
    RUN_BUDGET_CHANGED = "run.budget_changed"
    RUN_INCOMPATIBLE = "run.incompatible"  # parked: a recorded payload cannot be read by this code
    RUN_MIGRATED = "run.migrated"  # an operator moved the run to another bundle (``cairn migrate``)
    LEASE_CLAIMED = "lease.claimed"
    LEASE_LOST = "lease.lost"
    LEASE_TAKEN_OVER = "lease.taken_over"
    STEP_COMPLETED = "step.completed"
    STEP_FAILED = "step.failed"
    STEP_RETRIED = "step.retried"  # one attempt failed; another is scheduled
    OP_INTENT = "op.intent"  # a side effect is about to be attempted (durable before it is)
    OP_RECONCILED = "op.reconciled"  # the outside world was asked what an uncertain effect did
    OP_RESOLVED = "op.resolved"  # an operator said what an uncertain effect did


#: History entries that replay reads as the journal.
JOURNAL_EVENTS = frozenset(
    {
        EventType.STEP_COMPLETED,
        EventType.STEP_FAILED,
        EventType.STEP_RETRIED,
        EventType.OP_INTENT,
        EventType.OP_RECONCILED,
        EventType.OP_RESOLVED,
    }
)


class Durability(enum.StrEnum):
    """What a committed write survives (see docs/design.md)."""

    PROCESS = "process"  # survives a crash of any process; the default
    POWER = "power"  # survives power loss or an OS crash: fsync on every commit


@dataclass(slots=True, unsafe_hash=True)
class Payload:
    """An encoded value: inline bytes, or a reference into the artifact store.

    Never changed once built, like every record here, but not declared
    ``frozen``: one is built per journaled call, and a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (see
    ``HistoryEvent``). ``unsafe_hash`` keeps it hashable as it was."""

    data: bytes | None = None
    ref: str | None = None


#: the roles a run can be started with: the API tokens' (``cairn.api.tokens.Role``),
#: lowest first; the database checks the same list (SQLite 0024, PostgreSQL 0033)
STARTED_ROLES = ("viewer", "operator", "admin", "installation")


@dataclass(frozen=True, slots=True)
class NewRun:
    """Everything needed to create a run."""

    run_id: str
    workflow: str
    workflow_version: str
    tenant: str
    thread_id: str | None
    input: Payload
    queue: str = "default"
    priority: int = 0
    parent_run_id: str | None = None
    budget: dict[str, Any] | None = None
    #: the bundle the run executes on (``cairn.engine.bundles``); ``None``: a
    #: run created before bundles existed, served by any worker with its workflow
    bundle: str | None = None
    #: where the run was forked from (a graph run's replay or fork at a
    #: checkpoint: ``{"run_id": ..., "step": n, "edited": bool}``), recorded in
    #: its ``run.created`` entry (its lineage: ``cairn.graph.travel.lineage_of``)
    origin: dict[str, Any] | None = None
    #: the token role and token id the run is started with (``cairn.engine.access``):
    #: its rights wherever it is resumed; ``None``: started without a token
    started_role: str | None = None
    started_token: str | None = None

    @staticmethod
    def check_started(role: str | None, token: str | None) -> None:
        """Refuse a role that is not a token role, and a token without its role."""
        if role is not None and role not in STARTED_ROLES:
            raise InvalidArgument(f"a run is started as one of {', '.join(STARTED_ROLES)}, not {role!r}")
        if token is not None and (role is None or not isinstance(token, str) or not token):
            raise InvalidArgument("a run started with a token records the token's id and role")
    #: who started the run, how authenticated, with which tenant, role and
    #: delegated scopes (``cairn.api.actors``), recorded in its ``run.created``
    #: entry, which the audit chain covers
    started_by: dict[str, Any] | None = None
    #: whose data the run holds (a user, a customer: erasure by subject,
    #: ``cairn.api.erasure``); its values are sealed with that subject's data
    #: key, its children and memory writes inherit it; never changed
    subject: str | None = None

    def __post_init__(self) -> None:
        names = {"run_id": self.run_id, "workflow": self.workflow, "tenant": self.tenant, "queue": self.queue}
        if self.thread_id is not None:
            names["thread_id"] = self.thread_id
        check_names(**names)
        check_subject(self.subject)
        self.check_started(self.started_role, self.started_token)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) \
                or not -(2**63) <= self.priority < 2**63:  # a BIGINT on every backend
            raise InvalidArgument(f"a run's priority must be a 64-bit integer, not {self.priority!r}")


#: the names that travel as ids (in URLs, Server-Sent Events, the claim's
#: batches): they follow ``runids.check_id``. A tenant or a workflow name is
#: free text, shown escaped wherever it is shown; only a NUL is refused in it
#: (PostgreSQL's text cannot hold one, so SQLite must not either).
_IDS = frozenset({"run_id", "thread_id", "queue"})


#: the longest subject id accepted (an email address, a customer id: not a document)
MAX_SUBJECT = 256


def check_subject(subject: str | None) -> None:
    """Refuse a subject that is not a non-empty string of at most
    ``MAX_SUBJECT`` characters without control characters (``InvalidArgument``)."""
    if subject is None:
        return
    if not isinstance(subject, str) or not subject.strip():
        raise InvalidArgument("a subject is a non-empty string")
    if len(subject) > MAX_SUBJECT:
        raise InvalidArgument(f"a subject is at most {MAX_SUBJECT} characters, not {len(subject)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in subject):
        raise InvalidArgument("a subject holds no control characters")


def check_names(**names: str) -> None:
    """Refuse empty names (``InvalidArgument``): they would be ambiguous where
    they are keys (an empty tenant is the queue-wide token bucket's key, for
    one); ids that break the id rule (``runids.check_id``: control
    characters, ``.``/``..``, too long), on every path that creates a run;
    a NUL in any name."""
    for what, value in names.items():
        if not value:
            raise InvalidArgument(f"a run needs a non-empty {what.replace('_', ' ')}")
        if what in _IDS:
            check_id(what.replace("_", " "), value)
        elif "\x00" in value:
            raise InvalidArgument(f"the {what.replace('_', ' ')} {value!r} holds a NUL character (U+0000)")


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """What a run has spent, summed by the store over its whole history as
    ``engine.journal.Usage`` sums it (completed model calls' tokens and cost,
    tool entries), and its last entry's ``seq`` (0: none)."""

    tokens: int
    cost: float
    tool_calls: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as stored."""

    run_id: str
    workflow: str
    workflow_version: str
    tenant: str
    thread_id: str | None
    status: RunStatus
    input: Payload
    result: Payload | None
    error: dict[str, Any] | None
    epoch: int
    owner: str | None
    lease_expires_at: float | None
    wake_at: float | None
    waiting_on: str | None
    recoveries: int
    queue: str
    priority: int
    parent_run_id: str | None
    created_at: float
    updated_at: float
    budget: dict[str, Any] | None = None
    #: what a ``suspended`` run waits for besides a timer or a child: a wait
    #: key such as ``"signal:approve"``; a delivery for it wakes the run
    waiting_for: str | None = None
    #: the id of the bundle the run executes on, recorded at its start (see
    #: ``cairn.engine.bundles``); ``None`` for a run older than bundles
    bundle: str | None = None


class IndexEntry(NamedTuple):
    """An entry of a run's history as ``Store.history_index`` lists it: what
    a reader needs to find the entries it wants (their kind, name and
    position), without the rest of the row. ``event`` is the stored value."""

    seq: int
    event: str
    position: int | None
    step_kind: str | None
    name: str | None
    at: float


@dataclass(slots=True, unsafe_hash=True)
class HistoryEvent:
    """One entry of a run's append-only history.

    ``seq`` is gap-free and monotonic per run. ``epoch`` and ``worker`` record
    under which lease the entry was written, so an audit can tell which worker
    did what. Journal entries also carry ``position``, ``step_kind``, ``name``,
    ``input_hash``, ``attempt`` and the step's result ``payload``.

    Never changed once built (``dataclasses.replace`` makes a new one), but
    not declared ``frozen``: one is built for every journaled call, and a
    frozen dataclass's ``__init__`` sets each of the 14 fields through
    ``object.__setattr__``, about 22,000 instructions against 3,000 (a tenth
    of a whole step, measured with callgrind). ``unsafe_hash`` keeps the
    hash the frozen class had.
    """

    run_id: str
    seq: int
    event: EventType
    at: float
    epoch: int
    worker: str | None = None
    position: int | None = None
    step_kind: str | None = None
    name: str | None = None
    input_hash: str | None = None
    attempt: int | None = None
    started_at: float | None = None
    payload: Payload | None = None
    detail: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message in a run's mailbox: something delivered to the run (a
    signal, a decision) under a wait ``key``, kept in order of arrival
    (``seq``, per run) until the run consumes it. ``taken_position`` is the
    journal position whose entry recorded it: a message is consumed at most
    once. ``dedupe`` is the sender's idempotency key (a delivery repeated
    with the same one is the same delivery)."""

    run_id: str
    seq: int
    key: str
    payload: Payload | None
    sender: str | None
    dedupe: str | None
    sent_at: float
    taken_at: float | None = None
    taken_position: int | None = None


@dataclass(frozen=True, slots=True)
class BundleRecord:
    """A stored bundle: what decides a run's behaviour, by content hash.

    ``content`` is canonical JSON (the workflow's name, version and code
    hash, its prompts, model settings and tools); ``bundle_id`` is derived
    from it (``cairn.engine.bundles.bundle_id``), so a reader can check that
    the row is what its id says. Bundles are application definitions, not
    tenant data: one row serves every tenant. ``served_at`` is when a worker
    serving it last said so (``None``: never)."""

    bundle_id: str
    workflow: str
    version: str
    code: str
    content: bytes
    created_at: float
    served_at: float | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A run a worker now holds: its record after the claim, its history, and
    the next sequence number the holder must use for appends."""

    run: RunRecord
    history: list[HistoryEvent]
    next_seq: int


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Selects runs for listing; ``None`` fields do not filter."""

    statuses: tuple[RunStatus, ...] | None = None
    tenant: str | None = None
    workflow: str | None = None
    thread_id: str | None = None
    parent_run_id: str | None = None
    limit: int = 100


# -- approvals -------------------------------------------------------------------------------


class ApprovalStatus(enum.StrEnum):
    """Where an approval request stands. It leaves ``pending`` once, for
    good: decided (``approved``, ``rejected``, ``edited``: approved with
    other data) by a person, ``expired`` by its run when its timeout
    passed undecided, or ``voided`` by a rewind of its run that undid the
    request before anyone decided (the run asks again, under a new id)."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"
    EXPIRED = "expired"
    VOIDED = "voided"


#: The statuses a person may decide on a request.
DECISIONS = frozenset({ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EDITED})


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What the lease holder writes when its run asks for an approval, with
    the journal entry that records the request (whose payload holds the
    details). ``request_id`` is derived from the run and the entry's
    position, so replay and every worker name the same request.
    ``schema`` (JSON Schema) is what an edit must fit; ``approvers``
    (``None``: anyone) who may decide; ``expires_at`` (``None``: never) when
    the run stops waiting."""

    request_id: str
    action: str
    type_name: str
    schema: dict[str, Any] | None
    approvers: tuple[str, ...] | None
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval request as stored, with what a reader needs beside it:
    ``request`` is the payload of the journal entry that made it (its
    details), ``decision`` the payload of the mailbox message that delivered
    its decision (comment, edit), ``run_status`` its run's status."""

    run_id: str
    request_id: str
    tenant: str
    position: int
    request_seq: int
    action: str
    type_name: str
    schema: dict[str, Any] | None
    approvers: tuple[str, ...] | None
    requested_at: float
    expires_at: float | None
    status: ApprovalStatus
    decided_by: str | None
    decided_at: float | None
    comment: str | None
    decision_seq: int | None
    request: Payload | None
    decision: Payload | None
    run_status: RunStatus

    @property
    def key(self) -> str:
        """The wait key the run waits on and the decision is delivered under."""
        return approval_key(self.request_id)


def approval_key(request_id: str) -> str:
    """The mailbox key of approval request ``request_id``'s decision."""
    return f"approval:{request_id}"

# -- the HTTP API's bearer tokens (cairn.server) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A bearer token of the HTTP API as stored: bound to one ``tenant`` and
    one ``role``; only ``digest`` (the SHA-256 of its secret, hex) is kept,
    never the secret itself. ``revoked_at`` set: refused from then on."""

    token_id: str
    tenant: str
    role: str
    name: str
    digest: str
    created_at: float
    created_by: str | None = None
    revoked_at: float | None = None


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """A ``run_archives`` row: where run ``run_id``'s rows are, and what they were."""

    run_id: str
    tenant: str
    ref: str
    entries: int
    last_seq: int
    last_link: bytes | None
    #: the rows' encoded size before compression (what they are without the tables' overhead)
    hot_bytes: int
    stored_bytes: int
    archived_at: float
    actor: str | None
    #: who put the rows back and when: set on the record ``restore_run`` returns (the
    #: operator log keeps it, ``archive.restore``, as it keeps ``archive.move``'s actor)
    restored_by: str | None = None
    restored_at: float | None = None
