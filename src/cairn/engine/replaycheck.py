"""The replay check: would this code replay that run's journal?

``check`` runs a workflow function against a recorded journal in a dry
run: every journaled call compares itself with the journal as on a real
replay, and the check stops at the first call the journal has no outcome
for (the live end, where a real execution would start doing things). It
writes nothing, performs no effect and asks no model: the store it sees
refuses every write (``ReadOnlyStore``), and no call runs past the journal.

It reports the first divergence (the position, the recorded call and the
call the code made instead: a reordered, renamed, removed or added call) or
that the code is compatible. ``cairn replay-check``, ``cairn migrate`` and
``cairn.testing.replay`` are built on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cairn.codec.payloads import PayloadCodec
from cairn.engine.context import Context
from cairn.engine.definitions import WorkflowDef
from cairn.engine.execution import CURRENT, Call, Execution
from cairn.engine.runtime import Runtime
from cairn.engine.signals import Abandon, Ended, Release, Suspend
from cairn.engine.tools import settle_end
from cairn.errors import CairnError, IncompatiblePayload, NonDeterminismError
from cairn.store.records import Claim, HistoryEvent, RunRecord


class DryRunWrite(CairnError):
    """Something tried to write during a replay check (a bug if it ever shows)."""


class ReplayEnd(BaseException):
    """The dry run reached a call its journal has no outcome for."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay check found. ``compatible``: the code replays the whole
    journal; otherwise ``position``, ``recorded`` and ``requested`` name the
    first divergence. ``replayed``: journaled calls replayed before the end
    or the divergence."""

    run_id: str
    compatible: bool
    replayed: int
    position: int | None = None
    recorded: str | None = None
    requested: str | None = None
    note: str | None = None

    def describe(self) -> str:
        if self.compatible:
            return f"run {self.run_id}: compatible ({self.replayed} journaled call(s) replayed)" + (
                f"; {self.note}" if self.note else "")
        return (f"run {self.run_id}: diverges at position {self.position}: recorded {self.recorded}, "
                f"new code calls {self.requested}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ReadOnlyStore:
    """A store that answers reads and refuses every write (``DryRunWrite``)."""

    _READS = frozenset({"get_run", "history", "get_artifact", "deliveries", "delivery", "list_runs",
                        "bundles", "durability", "history_at", "model_calls", "history_headers",
                        "history_index"})

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name in self._READS:
            return getattr(self._store, name)
        raise DryRunWrite(f"a replay check may not {name.replace('_', ' ')}")


class _DryExecution(Execution):
    """An execution that stops where its journal ends instead of executing."""

    def _begin_at(self, position: int, kind: str, name: str, input_hash: str | None) -> Call:
        call = super()._begin_at(position, kind, name, input_hash)
        if call.recorded is None:
            raise ReplayEnd(position)
        return call

    def _new_call(self, position: int, kind: str, name: str, input_hash: str | None) -> Call:
        raise ReplayEnd(position)  # the journal's end: the first call it does not hold is never run

    def checkpoint(self) -> None:
        return None  # nothing to stop for: no lease, no worker


def check(runtime: Runtime, definition: WorkflowDef, run: RunRecord,
          history: Sequence[HistoryEvent]) -> ReplayReport:
    """Replay ``run``'s ``history`` against ``definition``'s code, dry."""
    store: Any = ReadOnlyStore(runtime.store)
    codec = PayloadCodec(store, runtime.payloads.inline_limit)
    dry = dataclasses.replace(runtime, store=store, payloads=codec)
    next_seq = (history[-1].seq if history else 0) + 1
    claim = Claim(run=run, history=list(history), next_seq=next_seq)
    execution = _DryExecution(dry, claim, "replay-check", is_async=definition.is_async)
    token = CURRENT.set(execution)
    try:
        return _check(dry, definition, execution)
    finally:
        CURRENT.reset(token)


def _check(runtime: Runtime, definition: WorkflowDef, ex: Execution) -> ReplayReport:
    run_id = ex.run_id

    def replayed() -> int:
        return ex.position

    try:
        raw = runtime.payloads.load(ex.run.input, Any, what=f"input of run {run_id!r}")
        args, kwargs = definition.call_args(definition.recorded(raw))
        ctx = Context(ex)
        if definition.is_async:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(definition.fn(ctx, *args, **kwargs))
            finally:
                loop.close()
        else:
            definition.fn(ctx, *args, **kwargs)
        if ex.suspension is not None:  # swallowed by the code (a bare except): it waits there all the same
            raise ex.suspension
        ex.close()
        settle_end(ex)
    except ReplayEnd as end:
        return ReplayReport(run_id, True, end.position)
    except NonDeterminismError as exc:
        return ReplayReport(run_id, False, exc.position, exc.position, exc.recorded, exc.requested)
    except Suspend as signal:
        if signal.reason == "needs_attention":
            detail = signal.detail or {}
            return ReplayReport(run_id, False, replayed(), detail.get("position"),
                                f"tool {detail.get('tool')!r} (an effect left unresolved)",
                                "nothing: the new code ends without settling it")
        return ReplayReport(run_id, True, replayed(), note=f"the code waits here ({signal.reason})")
    except (Release, Abandon, Ended) as exc:
        return ReplayReport(run_id, True, replayed(), note=f"stopped: {exc}")
    except DryRunWrite as exc:
        return ReplayReport(run_id, True, replayed(), note=str(exc))
    except IncompatiblePayload as exc:  # a recorded value this code cannot read (no upcaster): a report
        return ReplayReport(run_id, False, replayed(), exc.position, f"a {exc.type_name} payload",
                            f"a type it cannot read ({exc.why})")
    except Exception as exc:
        return _raised(run_id, ex, exc)
    return ReplayReport(run_id, True, replayed(), note="the code returns at the end of the journal")


def _raised(run_id: str, ex: Execution, exc: Exception) -> ReplayReport:
    """The workflow raised: compatible if that is where its journal ends
    (a run that failed the same way), else a divergence at the next entry."""
    beyond = sorted(p for p in ex.journal.outcomes if p >= ex.position)
    what = f"{type(exc).__qualname__}: {exc}"
    if not beyond:
        return ReplayReport(run_id, True, ex.position,
                            note=f"the code raises {what} at the end of the journal")
    recorded = ex.journal.outcomes[beyond[0]]
    return ReplayReport(run_id, False, ex.position, beyond[0], f"{recorded.step_kind} {recorded.name!r}",
                        f"nothing: the workflow raised {what}")

