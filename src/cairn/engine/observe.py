"""The engine's one hook for telemetry: an ``Observer`` on the ``Runtime``.

Why a hook and not OpenTelemetry calls in the engine: the engine must not
depend on an optional package, and an execution that nobody observes must
cost exactly what it cost before. So nothing here runs per step unless an
observer is set: ``executor.execute`` checks ``runtime.observer`` once per
claim and, only then, builds an ``ObservedExecution`` (whose ``_write``
reports each entry it recorded) instead of a plain ``Execution``. With no
observer the step's path is the same code, instruction for instruction.

An observer must be quick and must not raise: it runs on the executing
thread, inside the execution's lock (``_write``), between two journaled
calls. ``cairn.api.instrumentation.Telemetry`` is the implementation (live
spans and metrics through OpenTelemetry).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from cairn.engine.definitions import WorkflowDef
from cairn.engine.execution import Call, Execution
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


class ObservedExecution(Execution):
    """An ``Execution`` that reports every entry it appends to its observer.

    ``_write`` is where every appended entry of an execution goes
    (``append``, ``record_outcome``, ``rewind``); ``start_child`` writes its
    entry with the child's creation, so it is reported here too. Terminal
    writes (``complete``, ``fail``, ``suspend``...) end the claim and reach
    the observer as the ``Outcome``."""

    def __init__(self, observer: Observer, runtime: Runtime, claim: Claim, worker: str, *,
                 is_async: bool = False) -> None:
        super().__init__(runtime, claim, worker, is_async=is_async)
        self.observer = observer
        self.claim = claim
        #: what the observer keeps of this claim while it executes
        self.observed: Any = None

    def _write(self, event: HistoryEvent, barrier: bool) -> None:
        super()._write(event, barrier)
        try:
            self.observer.recorded(self, event)
        except Exception:  # telemetry never breaks a run
            log.exception("run %s: the observer failed on %s", self.run_id, event.event)

    def start_child(self, call: Call, definition: WorkflowDef, arguments: Any, child_id: str, *, queue: str,
                    priority: int) -> None:
        super().start_child(call, definition, arguments, child_id, queue=queue, priority=priority)
        event = self.journal.outcomes.get(call.position)
        if event is None:
            return
        try:
            self.observer.recorded(self, event)
        except Exception:
            log.exception("run %s: the observer failed on a child's start", self.run_id)
