"""The engine's one hook for telemetry: an ``Observer`` on the ``Runtime``.

Why a hook and not OpenTelemetry calls in the engine: the engine must not
depend on an optional package, and an execution that nobody observes must
cost exactly what it cost before. So nothing here runs per step unless an
observer is set: ``executor.execute`` checks ``runtime.observer`` once per
claim and, only then, builds an ``ObservedExecution`` (whose journal
reports each entry it takes in) instead of a plain ``Execution``. With no
observer the step's path is the same code, instruction for instruction.

An observer must be quick and must not raise: it runs on the executing
thread, inside the execution's lock, between two journaled
calls. ``cairn.api.instrumentation.Telemetry`` is the implementation (live
spans and metrics through OpenTelemetry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from cairn.engine.execution import Execution
from cairn.engine.journal import Journal
from cairn.engine.runtime import Runtime
from cairn.store.records import Claim, HistoryEvent

if TYPE_CHECKING:
    from cairn.engine.executor import Outcome

log = logging.getLogger("cairn.observe")


class Observer(Protocol):
    """What an observer is told about the claims a process executes."""

    def claimed(self, execution: Execution) -> None:
        """``execution`` starts on a claimed run (its claim's history included)."""

    def recorded(self, execution: Execution, event: HistoryEvent) -> None:
        """``execution`` appended ``event`` to its run's history (committed)."""

    def ended(self, execution: Execution, outcome: Outcome) -> None:
        """The claim ended so (``Outcome.status``: completed, failed, ...)."""


class _ReportingJournal(Journal):
    """A journal that reports each live entry taken into it.

    Every committed entry of an execution reaches its journal (``_write``,
    ``transact``, ``take_delivery``, approvals, child starts, ...): hooking
    the journal rather than each write path means a write path added later
    is observed without anyone remembering to."""

    report: Callable[[HistoryEvent], None] | None = None

    def record(self, event: HistoryEvent) -> None:
        super().record(event)
        if self.report is not None:
            self.report(event)


class ObservedExecution(Execution):
    """An ``Execution`` that reports every entry it appends to its observer.

    The claim's history is taken in before reporting starts, so only what
    this execution commits is reported. Terminal writes (``complete``,
    ``fail``, ``suspend``...) end the claim and reach the observer as the
    ``Outcome``."""

    def __init__(self, observer: Observer, runtime: Runtime, claim: Claim, worker: str, *,
                 is_async: bool = False) -> None:
        super().__init__(runtime, claim, worker, is_async=is_async)
        self.observer = observer
        self.claim = claim
        #: what the observer keeps of this claim while it executes
        self.observed: Any = None
        journal = _ReportingJournal(claim.history)
        journal.report = self._report
        self.journal = journal

    def _report(self, event: HistoryEvent) -> None:
        try:
            self.observer.recorded(self, event)
        except Exception:  # telemetry never breaks a run
            log.exception("run %s: the observer failed on %s", self.run_id, event.event)
