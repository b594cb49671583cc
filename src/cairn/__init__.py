"""Cairn: a durable runtime for long-running AI agents.

Write workflows as ordinary Python functions; Cairn journals every step so a
run killed at any instant resumes on any worker without repeating finished
work.
"""

from cairn.api.app import App
from cairn.api.context import ChildHandle, Context
from cairn.api.handles import RunHandle
from cairn.api.workflow import Workflow
from cairn.engine.execution import operation_id
from cairn.engine.retry import RetryableError, RetryPolicy, TerminalError
from cairn.engine.steps import Step, StepInfo, step_info
from cairn.errors import (
    CairnError,
    ChildFailed,
    LeaseLost,
    NonDeterminismError,
    PayloadError,
    RunFailed,
    RunNotFound,
    StepFailed,
)
from cairn.store.records import Durability, EventType, HistoryEvent, RunRecord, RunStatus

__version__ = "0.1.0"

__all__ = [
    "App",
    "CairnError",
    "ChildFailed",
    "ChildHandle",
    "Context",
    "Durability",
    "EventType",
    "HistoryEvent",
    "LeaseLost",
    "NonDeterminismError",
    "PayloadError",
    "RetryPolicy",
    "RetryableError",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "Step",
    "StepFailed",
    "StepInfo",
    "TerminalError",
    "Workflow",
    "operation_id",
    "step_info",
]
