"""Handles on runs, for the code that started them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from cairn.engine.budget import check_number
from cairn.engine.definitions import WorkflowDef
from cairn.errors import RunFailed
from cairn.graph.reader import Readers, graph_of
from cairn.store.records import RunRecord, RunStatus

if TYPE_CHECKING:
    from cairn.engine.runtime import Runtime

R = TypeVar("R")


class RunSource(Protocol):
    """What a handle reads through (``cairn.App`` is one): declared here so
    the handle needs nothing of the app module, which returns handles."""

    @property
    def runtime(self) -> Runtime: ...

    def get_run(self, run_id: str) -> RunRecord: ...

    @property
    def graph_readers(self) -> Readers: ...  # a graph run's result is its last checkpoint's state


class RunHandle(Generic[R]):
    """A run by id. Cheap to create; every call reads the store afresh."""

    def __init__(self, app: RunSource, run_id: str, *, created: bool | None = None) -> None:
        self.app = app
        self.run_id = run_id
        #: from ``app.start``: whether this call created the run (``False``: it
        #: existed already and was left unchanged); ``None`` when unknown
        self.created = created

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    def get(self) -> RunRecord:
        return self.app.get_run(self.run_id)

    def status(self) -> RunStatus:
        return self.get().status

    def result(self, timeout: float | None = None, poll_interval: float = 0.02) -> R:
        """Wait for the run to end and return its result.

        Raises ``RunFailed`` if it failed, was cancelled or was quarantined,
        and ``TimeoutError`` if it is still going after ``timeout`` seconds.
        Waiting polls the store, so the run may execute on any worker.
        """
        if timeout is not None:
            check_number("timeout", timeout, infinite=True)  # a NaN would wait for ever
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = poll_interval
        while True:
            record = self.get()
            if record.status.terminal:
                return self._outcome(record)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.run_id!r} is still {record.status.value} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def final(self, value: Any, definition: WorkflowDef | None = None) -> Any:
        """The result a caller sees for recorded result ``value``: a graph
        run records only its last super-step (the state is its checkpoint,
        not stored twice), so its result is the state read from there."""
        if not isinstance(value, dict) or "step" not in value:
            return value
        record = self.get()
        if definition is None:
            definition = self.app.runtime.registry.definition_for(record) \
                or self.app.runtime.workflows.get(record.workflow)
        graph = graph_of(definition.fn) if definition is not None else None
        if graph is None:
            return value
        step = value["step"]
        if record.status is RunStatus.COMPLETED:  # finished here: the state its last execution committed
            handed = self.app.runtime.handed.take((record.run_id, record.epoch, ("graph", step)))
            if handed is not None:
                return graph.schema.view(handed)
        return self.app.graph_readers.of(record).state(graph, step)

    def _outcome(self, record: RunRecord) -> R:
        if record.status is RunStatus.COMPLETED:
            definition = self.app.runtime.registry.definition_for(record) \
                or self.app.runtime.workflows.get(record.workflow)
            result_type: Any = definition.result_type if definition else Any
            if record.result is None:
                return None  # type: ignore[return-value]
            value: R = self.app.runtime.payloads.load(
                record.result, result_type, what=f"result of run {self.run_id!r}"
            )
            final: R = self.final(value, definition)
            return final
        error = record.error or {}
        message = f"{error.get('type', 'Error')}: {error.get('message', '')}"
        raise RunFailed(self.run_id, record.status.value, message)
