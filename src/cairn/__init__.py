"""Cairn: a durable runtime for long-running AI agents.

Write workflows as ordinary Python functions; Cairn journals every step so a
run killed at any instant resumes on any worker without repeating finished
work.
"""

# -- bundles: versions side by side, replay checks (issue 12)
from cairn import testing
from cairn.api.app import App
from cairn.api.approvals import NO_EDIT, ApprovalView
from cairn.api.handles import RunHandle
from cairn.api.operator import BundleView
from cairn.api.workflow import Workflow
from cairn.engine.approvals import Decision
from cairn.engine.budget import Budget
from cairn.engine.bundles import Bundle, BundleNotServed
from cairn.engine.context import ChildHandle, Context
from cairn.engine.execution import operation_id
from cairn.engine.replaycheck import ReplayReport
from cairn.engine.schedules import InvalidSchedule, Schedule
from cairn.engine.steps import Step, StepInfo, step_info
from cairn.engine.tools import Done, Effect, NotFound, Operation, Tool, Unknown
from cairn.engine.transactions import Transaction
from cairn.errors import (
    ApprovalClosed,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotFound,
    ApprovalRejected,
    CairnError,
    CallCancelled,
    ChildFailed,
    CredentialExpired,
    EffectNotApplied,
    InvalidArgument,
    InvalidEdit,
    InvalidSignal,
    LeaseLost,
    LogicalFailure,
    MigrationRefused,
    NonDeterminismError,
    NotAnApprover,
    PayloadError,
    ReplayDivergence,
    RunBlocked,
    RunFailed,
    RunNeedsAttention,
    RunNotFound,
    RunSuspended,
    SecretError,
    SecretLeak,
    SecretNotFound,
    SecurityViolation,
    SignalRefused,
    SignalTimeout,
    SQLError,
    StepFailed,
    ToolResultInvalid,
    ToolTimeout,
    TransactionMisuse,
)
from cairn.memory import Item, Memory, MemoryPolicy, Message, Retention, SearchResult
from cairn.retry import RetryableError, RetryPolicy, TerminalError
from cairn.security.secrets import (
    Access,
    CallableSecrets,
    EnvSecrets,
    FileSecrets,
    Secret,
    SecretProvider,
    Secrets,
    SecretValue,
)
from cairn.store.admission import QueueLimits, QueueStats, Rate
from cairn.store.records import ApprovalStatus, Durability, EventType, HistoryEvent, RunRecord, RunStatus
from cairn.store.transactions import Result, Tx

__version__ = "0.1.0"

__all__ = [
    "NO_EDIT",
    "Access",
    "App",
    "ApprovalClosed",
    "ApprovalError",
    "ApprovalExpired",
    "ApprovalNotFound",
    "ApprovalRejected",
    "ApprovalStatus",
    "ApprovalView",
    "Budget",
    "Bundle",
    "BundleNotServed",
    "BundleView",
    "CairnError",
    "CallCancelled",
    "CallableSecrets",
    "ChildFailed",
    "ChildHandle",
    "Context",
    "CredentialExpired",
    "Decision",
    "Done",
    "Durability",
    "Effect",
    "EffectNotApplied",
    "EnvSecrets",
    "EventType",
    "FileSecrets",
    "HistoryEvent",
    "InvalidArgument",
    "InvalidEdit",
    "InvalidSchedule",
    "InvalidSignal",
    "Item",
    "LeaseLost",
    "LogicalFailure",
    "Memory",
    "MemoryPolicy",
    "Message",
    "MigrationRefused",
    "NonDeterminismError",
    "NotAnApprover",
    "NotFound",
    "Operation",
    "PayloadError",
    "QueueLimits",
    "QueueStats",
    "Rate",
    "ReplayDivergence",
    "ReplayReport",
    "Result",
    "Retention",
    "RetryPolicy",
    "RetryableError",
    "RunBlocked",
    "RunFailed",
    "RunHandle",
    "RunNeedsAttention",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "RunSuspended",
    "SQLError",
    "Schedule",
    "SearchResult",
    "Secret",
    "SecretError",
    "SecretLeak",
    "SecretNotFound",
    "SecretProvider",
    "SecretValue",
    "Secrets",
    "SecurityViolation",
    "SignalRefused",
    "SignalTimeout",
    "Step",
    "StepFailed",
    "StepInfo",
    "TerminalError",
    "Tool",
    "ToolResultInvalid",
    "ToolTimeout",
    "Transaction",
    "TransactionMisuse",
    "Tx",
    "Unknown",
    "Workflow",
    "operation_id",
    "step_info",
    "testing",
]
