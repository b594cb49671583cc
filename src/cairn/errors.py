"""Every exception Cairn raises on purpose, in one place.

``CairnError`` subclasses are user-facing and carry a one-line message fit for
the CLI. ``LeaseLost`` is deliberately a ``BaseException``: like
``asyncio.CancelledError`` it must travel through user code that catches
``Exception``, because a worker that has lost its lease must stop at once.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any


class CairnError(Exception):
    """Base class of Cairn's user-facing errors."""


class ConfigError(CairnError):
    """Bad configuration: an unknown database URL, an unloadable app, ..."""


class MissingExtra(ConfigError, ImportError):
    """A feature was used whose optional dependencies are not installed.

    ``pip install cairn-runtime`` installs the core only; PostgreSQL, the HTTP
    server, the OpenAI adapter, OpenTelemetry and the LangGraph store come as
    extras, imported only where they are used. The message is one line that
    names the extra to install, so the CLI prints it as is (a ``CairnError``)
    and code that guards an optional import with ``except ImportError`` keeps
    working (an ``ImportError``). ``.ci/check_install.py`` asserts this message
    for every module of a venv without the extra.
    """

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(missing_extra_message(feature, extra))
        self.feature = feature
        self.extra = extra


def missing_extra_message(feature: str, extra: str) -> str:
    """The one line a missing extra is reported with."""
    return f"{feature} needs the '{extra}' extra: pip install 'cairn-runtime[{extra}]'"


class InvalidArgument(CairnError, ValueError):
    """An argument Cairn cannot accept: an empty tenant or queue name, a
    concurrency limit of zero, a malformed rate. Also a ``ValueError``."""


class StoreError(CairnError):
    """The database could not be opened or used."""


class RunNotFound(CairnError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}")
        self.run_id = run_id


class InvalidRunState(CairnError):
    """An operation that the run's current status does not allow."""


class RunIdTaken(InvalidRunState):
    """A run id already held by a run that is not the one being created (a
    child's id taken by a run that is not that parent's child). It names no
    tenant: "taken" is all a caller learns."""


class UnknownWorkflow(CairnError):
    def __init__(self, name: str, known: list[str] | None = None) -> None:
        hint = f" (known: {', '.join(sorted(known))})" if known else ""
        super().__init__(f"unknown workflow {name!r}{hint}")
        self.name = name


class NonDeterminismError(BaseException):
    """The workflow asked for a different step than its journal records, or
    ended before its journal does.

    Raised on replay; the run fails and nothing recorded is overwritten. A
    ``BaseException`` (like ``LeaseLost``) because the everyday agent pattern
    ``try: tool() except Exception:`` must not hide it: a run that swallowed
    it would write new steps on top of an old journal.
    """

    def __init__(self, run_id: str, position: int, recorded: str, requested: str) -> None:
        super().__init__(
            f"non-determinism in run {run_id!r} at position {position}: "
            f"journal recorded {recorded}, workflow requested {requested}"
        )
        self.run_id = run_id
        self.position = position
        self.recorded = recorded
        self.requested = requested


class PayloadError(CairnError):
    """A value could not be encoded, or stored bytes could not be decoded."""


class ThreadTaken(CairnError):
    """A ``CairnSaver`` that wrote a LangGraph thread lost it to another saver
    (another process drove the thread since): its writes to the thread are
    refused, so the two never fork the thread's chain of checkpoints. A new
    saver takes the thread back on its first write."""


class UnreadableCheckpoint(PayloadError):
    """A stored LangGraph checkpoint (``cairn.langgraph.CairnSaver``) could
    not be decoded, or held what its serializer must never run (a pickle, a
    constructor outside the allowlist): the message names the checkpoint.
    Raised instead of returning ``None`` or a default, so a damaged row is
    never mistaken for an empty thread."""


class StepFailed(CairnError):
    """A step failed for good (terminal error, or retries exhausted).

    Raised inside the workflow both on first execution and on replay, so code
    that handles step failures behaves the same both times. The original
    exception type is kept by name only: recreating arbitrary exception
    classes from stored data would mean trusting that data.
    """

    def __init__(self, step: str, error_type: str, message: str, attempts: int) -> None:
        super().__init__(f"step {step!r} failed after {attempts} attempt(s): {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.message = message
        self.attempts = attempts


class ChildFailed(CairnError):
    """A child workflow ended without a result (failed or cancelled)."""

    def __init__(self, run_id: str, status: str, error: str) -> None:
        super().__init__(f"child run {run_id!r} {status}: {error}")
        self.run_id = run_id
        self.status = status
        self.error = error


class RunFailed(CairnError):
    """Raised by ``RunHandle.result()`` when the run ended without a result."""

    def __init__(self, run_id: str, status: str, error: str) -> None:
        super().__init__(f"run {run_id!r} {status}: {error}")
        self.run_id = run_id
        self.status = status
        self.error = error


class RunBlocked(CairnError):
    """Raised by ``app.run``/``app.resume`` when the run stopped where it will
    not go on by itself: waiting for an operator, or for a budget raise.
    Executing or waiting any longer here would block forever; ``status`` and
    ``reason`` say what it needs."""

    def __init__(self, run_id: str, status: str, reason: str) -> None:
        super().__init__(f"run {run_id!r} is {status}: {reason}")
        self.run_id = run_id
        self.status = status
        self.reason = reason


class RunNeedsAttention(RunBlocked):
    """The run waits for an operator (``cairn resolve``, ``cairn resume``):
    an uncertain side effect, or a kill switch."""


class RunSuspended(RunBlocked):
    """The run is suspended with nothing that will wake it (its budget is
    exceeded): raise the budget, then resume it."""


class LeaseLost(BaseException):
    """A fenced write was rejected: another worker (or an operator) now owns
    the run, so everything this holder still wants to write is void."""

    def __init__(self, run_id: str, epoch: int) -> None:
        super().__init__(f"lease on run {run_id!r} at epoch {epoch} is no longer held")
        self.run_id = run_id
        self.epoch = epoch


class RetentionFenced(CairnError):
    """A retention controller's deletion was refused: another controller took
    its lease (or it expired), so this one deletes nothing more until it
    takes the lease again (``cairn.worker.retention``)."""


class EffectNotApplied(CairnError):
    """Raise from a ``write`` tool when the outside world certainly did *not*
    change (the request was refused before it was applied). Such a failure is
    definite, so the retry policy applies; any other exception from a write
    tool leaves the effect uncertain and triggers reconciliation."""


class ToolResultInvalid(CairnError):
    """A tool returned a result that does not match its declared schema."""

    def __init__(self, tool: str, problem: str) -> None:
        super().__init__(f"tool {tool!r} returned a malformed result: {problem}")
        self.tool = tool


class CallCancelled(CairnError):
    """An async step or tool body raised ``asyncio.CancelledError`` although
    nothing cancelled its task: recorded as the call's failure (retried by its
    policy; for a ``write`` tool the effect is uncertain and reconciled),
    never a crash of the worker."""


class ToolTimeout(CairnError, TimeoutError):
    """A tool did not return within its ``timeout``. For a ``write`` tool the
    effect is then uncertain: the call may still complete after we stopped
    waiting.

    ``pending`` is the call still running in its thread (a sync call cannot be
    stopped), or ``None``: while it runs, the operation is in flight, and it
    is neither reconciled nor sent again."""

    def __init__(self, message: str, pending: Future[Any] | None = None) -> None:
        super().__init__(message)
        self.pending = pending


class SecurityViolation(BaseException):
    """Raise from anywhere in a run to stop it at once: the run is halted, its
    lease revoked and it is never retried automatically. A ``BaseException``
    so that no ``except Exception`` in workflow code can swallow it."""


class LogicalFailure(BaseException):
    """The run reached a wrong result and must go back to an earlier step.

    ``rewind_to`` names a step (or tool, or model) already executed in this
    run; the journal from its latest execution on is voided and the run
    continues from there, with ``ctx.rewinds()`` telling it why. A
    ``BaseException`` so that workflow code cannot swallow it by accident.
    """

    def __init__(self, reason: str, rewind_to: str) -> None:
        super().__init__(f"{reason} (rewinding to {rewind_to!r})")
        self.reason = reason
        self.rewind_to = rewind_to


class RewindFailed(CairnError):
    """A ``LogicalFailure`` could not rewind: no such earlier step, or the
    run has used up its rewinds. The run fails (an operator is needed)."""


# -- secrets and credentials (cairn.security) ------------------------------------------


class SecretError(CairnError):
    """A secret could not be resolved: its provider failed, refused the
    reference (``allow=`` policy), or handed back a value already expired.
    Raised where the secret is used (just before a step or tool body runs),
    so the call's retry policy decides; the body never ran."""


class SecretNotFound(SecretError):
    """No provider of that name, or the provider holds no such secret."""


class CredentialExpired(EffectNotApplied):
    """Raise from a step or tool when the service refused a credential as
    expired or revoked (an HTTP 401, an ``invalid_token``). The runtime then
    refreshes the secrets the call used through their provider and runs the
    attempt again at once, with the same operation id, a bounded number of
    times and without spending an attempt of the retry policy.

    It is an ``EffectNotApplied``: raising it from a ``write`` tool states
    that the request was refused before anything changed, which is what
    makes resending it safe. ``secret`` names the one secret to refresh
    (default: every secret the call used)."""

    def __init__(self, message: str = "the credential has expired", *, secret: str | None = None) -> None:
        super().__init__(message)
        self.secret = secret


class SecretLeak(PayloadError):
    """A resolved secret value (``SecretValue``, or the text it revealed)
    reached something that would record it: a journal entry, an event, an
    artifact. Refused before anything is written; record the ``Secret``
    reference instead."""

# -- signals and published events (``ctx.wait_for_signal``, ``ctx.signal``) ---------------


class SignalTimeout(CairnError, TimeoutError):
    """``ctx.wait_for_signal(name, timeout=...)``: the durable timeout fired
    before a signal ``name`` arrived. Recorded in the journal, so replay
    raises it again at the same call; catch it to take another path (the
    run may wait again: a new call, with a new deadline)."""

    def __init__(self, name: str, timeout: float | None) -> None:
        after = f" within {timeout:g}s" if timeout is not None else ""
        super().__init__(f"no signal {name!r} arrived{after}")
        self.name = name
        self.timeout = timeout


class InvalidSignal(PayloadError):
    """A signal arrived whose data does not fit the type the waiting call
    asked for (``type_=``). The message is consumed (so it cannot block the
    signals behind it) and this failure is recorded at the call: the
    workflow may catch it and wait again for the next one. ``sender`` and
    ``seq`` say which message it was."""

    def __init__(self, name: str, problem: str, *, seq: int | None = None, sender: str | None = None) -> None:
        source = f" from {sender}" if sender else ""
        super().__init__(f"signal {name!r}{source} does not fit the expected type: {problem}")
        self.name = name
        self.problem = problem
        self.seq = seq
        self.sender = sender


class SignalRefused(CairnError):
    """``ctx.signal(run_id, ...)`` from a workflow was refused: the target is
    unknown (another tenant's run is reported exactly the same way) or
    finished. Recorded, so replay raises it again rather than send."""

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(reason)
        self.run_id = run_id
        self.reason = reason

# -- approvals ---------------------------------------------------------------------------------


class ApprovalError(CairnError):
    """A decision on an approval request that cannot be taken; nothing was
    stored. (Its subclasses say why.)"""


class ApprovalNotFound(ApprovalError):
    """The run has no approval request with that id (another tenant's run
    reads as no run at all: ``RunNotFound``)."""

    def __init__(self, run_id: str, request_id: str) -> None:
        super().__init__(f"run {run_id!r} has no approval request {request_id!r}")
        self.run_id = run_id
        self.request_id = request_id


class ApprovalClosed(ApprovalError):
    """The request was decided already, or expired: a request is decided once."""


class NotAnApprover(ApprovalError):
    """The acting identity is not among the request's approvers."""


class InvalidEdit(ApprovalError):
    """An edit that does not fit the request's type."""


class ApprovalRejected(CairnError):
    """Raised in the workflow by a protected tool whose call was rejected
    (or whose approval expired): the tool did not run. ``decision`` is the
    ``cairn.Decision`` (who, when, comment). The workflow may catch it."""

    def __init__(self, message: str, decision: Any) -> None:
        super().__init__(message)
        self.decision = decision


class ApprovalExpired(ApprovalRejected):
    """A protected tool's approval request timed out undecided: the tool did not run."""

# -- bundles (cairn.engine.bundles) ----------------------------------------------------------


class MigrationRefused(InvalidRunState):
    """``cairn migrate``: the replay check found that the target bundle's
    code diverges from the run's journal (``--force --reason`` overrides)."""


class ReplayDivergence(CairnError, AssertionError):
    """``cairn.testing.replay``: new code would diverge from a recorded run.
    An ``AssertionError`` too, so a test suite reports it as a failure."""


class IncompatiblePayload(BaseException):
    """A recorded payload has no path to the current version of its type
    (``cairn.codec.upcasters``): the run is parked as ``incompatible``,
    naming the type, the versions and the position, and ``cairn retry``
    resumes it once an upcaster is deployed. A ``BaseException``, so that
    ``except Exception`` in workflow code cannot turn it into a guess."""

    def __init__(self, type_name: str, found: object, current: int | None, why: str,
                 position: int | None = None) -> None:
        where = f" at position {position}" if position is not None else ""
        if found is None:  # not a version's problem: the recorded value no longer fits the code's type
            super().__init__(f"a recorded {type_name} payload{where} does not fit the code's type: {why}")
        else:
            super().__init__(f"a recorded {type_name} payload{where} is version {found}, the code's is "
                             f"{current}: {why}")
        self.type_name = type_name
        self.found = found
        self.current = current
        self.why = why
        self.position = position

    def at(self, position: int) -> IncompatiblePayload:
        """The same error, naming the journal position of the payload."""
        if self.position is not None:
            return self
        return IncompatiblePayload(self.type_name, self.found, self.current, self.why, position)


class SQLError(CairnError):
    """A statement of a transactional step failed (a constraint, a syntax
    error): the transaction is rolled back, user rows included, and the step
    fails by its retry policy like any step."""


class TransactionMisuse(CairnError):
    """A transactional step's body tried what only Cairn may do in its
    transaction (end it, open a savepoint, change the session), or used its
    handle after the body returned. Refused before anything is sent; the
    step fails at once, never retried (the same code would do it again)."""


class WorkspaceError(CairnError):
    """A run's workspace cannot be snapshotted or restored: a file kind a
    snapshot cannot hold (a socket, a device), or a directory it may not
    write through."""


class UnsafeSnapshot(WorkspaceError):
    """A stored workspace object is refused: damaged (it no longer hashes to
    its id), or hostile (a name with ``/`` or ``..``, an absolute path, an
    unknown entry kind). Nothing of it is written to disk."""
