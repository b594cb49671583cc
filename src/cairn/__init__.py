"""Cairn: a durable runtime for long-running AI agents.

Write workflows as ordinary Python functions; Cairn journals every step so a
run killed at any instant resumes on any worker without repeating finished
work.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The names below are imported on first use (PEP 562), not here: ``import
# cairn`` and every ``import cairn.<module>`` (the CLI, a worker process, the
# store's tests) run this file first, and importing all of them eagerly costs
# what the whole library costs (a few hundred dataclasses, the engine, the
# store, the codec), which a process that needs one module need not pay.
# ``from cairn import App`` costs what App needs; mypy and readers see the
# imports themselves under TYPE_CHECKING. tests/test_imports.py checks that
# every name of ``__all__`` resolves and that ``import cairn`` stays light.
if TYPE_CHECKING:
    from cairn import testing
    from cairn.api.app import App
    from cairn.api.approvals import NO_EDIT, ApprovalView
    from cairn.api.handles import RunHandle
    from cairn.api.operator import BundleView
    from cairn.api.workflow import Workflow
    from cairn.engine.access import ToolAccess, ToolRefused
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
        UnsafeSnapshot,
        WorkspaceConflict,
        WorkspaceError,
    )
    from cairn.graph.errors import GraphError, InvalidGraph
    from cairn.graph.graph import END, START, Graph, Send
    from cairn.graph.reader import Checkpoint
    from cairn.graph.reducers import append, merge
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

#: each public name -> the module that defines it (a name equal to its module's last part is that module)
_LAZY: dict[str, str] = {
    "App": "cairn.api.app",
    "ApprovalView": "cairn.api.approvals",
    "NO_EDIT": "cairn.api.approvals",
    "RunHandle": "cairn.api.handles",
    "BundleView": "cairn.api.operator",
    "Workflow": "cairn.api.workflow",
    "Graph": "cairn.graph.graph",
    "START": "cairn.graph.graph",
    "END": "cairn.graph.graph",
    "Send": "cairn.graph.graph",
    "append": "cairn.graph.reducers",
    "merge": "cairn.graph.reducers",
    "Checkpoint": "cairn.graph.reader",
    "GraphError": "cairn.graph.errors",
    "InvalidGraph": "cairn.graph.errors",
    "Decision": "cairn.engine.approvals",
    "Budget": "cairn.engine.budget",
    "Bundle": "cairn.engine.bundles",
    "BundleNotServed": "cairn.engine.bundles",
    "ChildHandle": "cairn.engine.context",
    "Context": "cairn.engine.context",
    "operation_id": "cairn.engine.execution",
    "ReplayReport": "cairn.engine.replaycheck",
    "InvalidSchedule": "cairn.engine.schedules",
    "Schedule": "cairn.engine.schedules",
    "Step": "cairn.engine.steps",
    "step_info": "cairn.engine.steps",
    "StepInfo": "cairn.engine.steps",
    "ToolAccess": "cairn.engine.access",
    "ToolRefused": "cairn.engine.access",
    "Done": "cairn.engine.tools",
    "Effect": "cairn.engine.tools",
    "NotFound": "cairn.engine.tools",
    "Operation": "cairn.engine.tools",
    "Tool": "cairn.engine.tools",
    "Unknown": "cairn.engine.tools",
    "Transaction": "cairn.engine.transactions",
    "ApprovalClosed": "cairn.errors",
    "ApprovalError": "cairn.errors",
    "ApprovalExpired": "cairn.errors",
    "ApprovalNotFound": "cairn.errors",
    "ApprovalRejected": "cairn.errors",
    "CairnError": "cairn.errors",
    "CallCancelled": "cairn.errors",
    "ChildFailed": "cairn.errors",
    "CredentialExpired": "cairn.errors",
    "EffectNotApplied": "cairn.errors",
    "InvalidArgument": "cairn.errors",
    "InvalidEdit": "cairn.errors",
    "InvalidSignal": "cairn.errors",
    "LeaseLost": "cairn.errors",
    "LogicalFailure": "cairn.errors",
    "MigrationRefused": "cairn.errors",
    "NonDeterminismError": "cairn.errors",
    "NotAnApprover": "cairn.errors",
    "PayloadError": "cairn.errors",
    "ReplayDivergence": "cairn.errors",
    "RunBlocked": "cairn.errors",
    "RunFailed": "cairn.errors",
    "RunNeedsAttention": "cairn.errors",
    "RunNotFound": "cairn.errors",
    "RunSuspended": "cairn.errors",
    "SecretError": "cairn.errors",
    "SecretLeak": "cairn.errors",
    "SecretNotFound": "cairn.errors",
    "SecurityViolation": "cairn.errors",
    "SignalRefused": "cairn.errors",
    "SignalTimeout": "cairn.errors",
    "SQLError": "cairn.errors",
    "StepFailed": "cairn.errors",
    "ToolResultInvalid": "cairn.errors",
    "ToolTimeout": "cairn.errors",
    "TransactionMisuse": "cairn.errors",
    "UnsafeSnapshot": "cairn.errors",
    "WorkspaceConflict": "cairn.errors",
    "WorkspaceError": "cairn.errors",
    "Item": "cairn.memory",
    "Memory": "cairn.memory",
    "MemoryPolicy": "cairn.memory",
    "Message": "cairn.memory",
    "Retention": "cairn.memory",
    "SearchResult": "cairn.memory",
    "RetryableError": "cairn.retry",
    "RetryPolicy": "cairn.retry",
    "TerminalError": "cairn.retry",
    "Access": "cairn.security.secrets",
    "CallableSecrets": "cairn.security.secrets",
    "EnvSecrets": "cairn.security.secrets",
    "FileSecrets": "cairn.security.secrets",
    "Secret": "cairn.security.secrets",
    "SecretProvider": "cairn.security.secrets",
    "Secrets": "cairn.security.secrets",
    "SecretValue": "cairn.security.secrets",
    "QueueLimits": "cairn.store.admission",
    "QueueStats": "cairn.store.admission",
    "Rate": "cairn.store.admission",
    "ApprovalStatus": "cairn.store.records",
    "Durability": "cairn.store.records",
    "EventType": "cairn.store.records",
    "HistoryEvent": "cairn.store.records",
    "RunRecord": "cairn.store.records",
    "RunStatus": "cairn.store.records",
    "Result": "cairn.store.transactions",
    "Tx": "cairn.store.transactions",
    "testing": "cairn.testing",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (then cached here)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cairn' has no attribute {name!r}")
    imported = importlib.import_module(module)
    value = imported if module == f"cairn.{name}" else getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "END",
    "NO_EDIT",
    "START",
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
    "Checkpoint",
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
    "Graph",
    "GraphError",
    "HistoryEvent",
    "InvalidArgument",
    "InvalidEdit",
    "InvalidGraph",
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
    "Send",
    "SignalRefused",
    "SignalTimeout",
    "Step",
    "StepFailed",
    "StepInfo",
    "TerminalError",
    "Tool",
    "ToolAccess",
    "ToolRefused",
    "ToolResultInvalid",
    "ToolTimeout",
    "Transaction",
    "TransactionMisuse",
    "Tx",
    "Unknown",
    "UnsafeSnapshot",
    "Workflow",
    "WorkspaceConflict",
    "WorkspaceError",
    "append",
    "merge",
    "operation_id",
    "step_info",
    "testing",
]
