"""Where the engine plugs the memory API in: the two channels of
``cairn.memory.api``.

* ``StepChannel`` (``op.memory`` in a tool, ``step_info().memory`` in a
  step): writes go to ``Execution.memory_buffers`` under the call's position
  and attempt, and ``Execution.record_outcome`` commits them in the
  transaction of the call's journal entry (``Store.append_memory``). A crash
  before the entry leaves none of them, a failed attempt's are dropped, a
  recorded call is replayed without running its body (so without writing
  again), and a stale holder's append is fenced out with its writes.
* ``WorkflowChannel`` (``ctx.memory``): each read is a journaled call (its
  value recorded, replayed from the record); each write is a journaled call
  whose entry commits with the write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cairn.codec import values
from cairn.engine.execution import Execution
from cairn.errors import CairnError
from cairn.memory.api import Memory
from cairn.store.memrecords import MemoryWrite


class _Channel:
    def __init__(self, execution: Execution) -> None:
        run = execution.run
        self.execution = execution
        self.store = execution.store
        self.codec = execution.runtime.payloads
        self.policy = execution.runtime.memory
        self.tenant = run.tenant
        self.run_id: str | None = run.run_id
        self.thread_id = run.thread_id


class StepChannel(_Channel):
    """Buffered writes, committed with the step's entry; plain reads."""

    def __init__(self, execution: Execution, position: int, attempt: int) -> None:
        super().__init__(execution)
        self.position = position
        self.attempt = attempt

    def read(self, name: str, args: tuple[Any, ...], result_type: Any, read: Callable[[], Any]) -> Any:
        return read()

    def write(self, name: str, args: tuple[Any, ...], write: MemoryWrite) -> None:
        buffers = self.execution.memory_buffers
        with self.execution._lock:
            held = buffers.get(self.position)
            if held is None or held[0] != self.attempt:  # an earlier attempt's are void
                held = (self.attempt, [])
                buffers[self.position] = held
            held[1].append(write)


class WorkflowChannel(_Channel):
    """Journaled reads and writes."""

    def read(self, name: str, args: tuple[Any, ...], result_type: Any, read: Callable[[], Any]) -> Any:
        ex = self.execution
        call = ex.begin("memory", name, _hash(args))
        if call.recorded is not None:
            return ex.replay(call, result_type)
        return ex.complete_call(call, read(), result_type)

    def write(self, name: str, args: tuple[Any, ...], write: MemoryWrite) -> None:
        ex = self.execution
        call = ex.begin("memory", name, _hash(args))
        if call.recorded is None:
            ex.record_memory(call, None, (write,))


def _hash(args: tuple[Any, ...]) -> str:
    """The input hash of a journaled memory call (its arguments are JSON:
    the API encoded its values before it got here)."""
    return values.digest(values.encode(args))


def step_memory(execution: Execution | None, position: int, attempt: int) -> Memory:
    """The memory of the step or tool body running at ``position``."""
    if execution is None:
        raise CairnError("memory is only available inside a step or tool of a running workflow")
    return Memory(StepChannel(execution, position, attempt))


def workflow_memory(execution: Execution) -> Memory:
    return Memory(WorkflowChannel(execution))


__all__ = ["StepChannel", "WorkflowChannel", "step_memory", "workflow_memory"]
