"""The engine's one hook for telemetry: an ``Observer`` on the ``Runtime``.

Why a hook and not OpenTelemetry calls in the engine: the engine must not
depend on an optional package, and an execution that nobody observes must
cost exactly what it cost before. So nothing here runs per step unless an
observer is set: ``executor.execute`` checks ``runtime.observer`` once per
claim and, only then, builds an ``executor.ObservedExecution`` (whose
journal reports each entry it takes in) instead of a plain ``Execution``.
With no observer the step's path is the same code, instruction for
instruction.

An observer must be quick and must not raise: it runs on the executing
thread, inside the execution's lock, between two journaled
calls. ``cairn.api.instrumentation.Telemetry`` is the implementation (live
spans and metrics through OpenTelemetry).

This module holds only the contract, so that it sits low: the ``Runtime``
names the ``Observer`` and the executor calls it, both above. What an
observer reads of an execution and of its end are Protocols (``Observed``,
``Ending``) rather than ``Execution`` and ``Outcome`` themselves, which live
above the runtime.
"""

from __future__ import annotations

from typing import Any, Protocol

from cairn.engine.journal import Journal
from cairn.store.contract import Store
from cairn.store.records import Claim, HistoryEvent, RunRecord


class Observed(Protocol):
    """What an observer reads of an execution it is told about
    (``executor.ObservedExecution``): the claim and its run, the journal so
    far, the store (to look up a parent run), and ``observed``, where the
    observer keeps what it needs of this claim while it executes."""

    observed: Any

    @property
    def claim(self) -> Claim: ...

    @property
    def run(self) -> RunRecord: ...

    @property
    def worker(self) -> str: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def store(self) -> Store: ...


class Ending(Protocol):
    """How a claim ended, as an observer is told (``executor.Outcome``)."""

    @property
    def status(self) -> str:
        """completed, failed, suspended, released, lost, abandoned, ..."""

    @property
    def error(self) -> str | None: ...


class Observer(Protocol):
    """What an observer is told about the claims a process executes."""

    def claimed(self, execution: Observed) -> None:
        """``execution`` starts on a claimed run (its claim's history included)."""

    def recorded(self, execution: Observed, event: HistoryEvent) -> None:
        """``execution`` appended ``event`` to its run's history (committed)."""

    def ended(self, execution: Observed, outcome: Ending) -> None:
        """The claim ended so (``Ending.status``: completed, failed, ...)."""


__all__ = ["Ending", "Observed", "Observer"]
