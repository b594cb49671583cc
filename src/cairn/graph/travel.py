"""Time travel over a graph run's checkpoints: the seed a replay or a fork
starts from, the state at a checkpoint as plain JSON (read without the
graph's code), an edit of the state validated as the graph validates an
update, and a run's lineage.

A replay or a fork at super-step ``n`` of run ``R`` is a *new run* whose
input is the state at ``n`` (edited, for a fork) and a ``Seed`` naming
``R``, ``n`` and the tasks checkpoint ``n`` said run next. The runner
commits that state as the new run's checkpoint ``n`` (every field set, no
node ran) and goes on from there: nothing of ``R``'s journal after ``n``
(the super-step in flight, its tool calls and model calls, its approvals,
its run memory) is copied, so nothing of it is reused. The new run's
``run.created`` entry records where it comes from (``NewRun.origin``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from cairn.errors import InvalidArgument
from cairn.graph.checkpoints import Record, Task
from cairn.graph.errors import GraphError
from cairn.graph.state import Schema
from cairn.store.records import HistoryEvent

#: the keyword parameter of a graph workflow carrying a replay's or a fork's seed
SEED_PARAM = "cairn_fork"


class Seed(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a replayed or forked graph run starts: super-step ``step`` of
    run ``run_id``, whose checkpoint named ``next`` as the tasks to run
    (``[node]``, or ``[node, arg]`` for a ``Send``)."""

    run_id: str
    step: int
    next: list[list[Any]]

    def tasks(self) -> list[Task]:
        return [Task(str(t[0]), t[1], True) if len(t) > 1 else Task(str(t[0])) for t in self.next]


def seed_of(run_id: str, record: Record) -> Seed:
    """The seed of a run starting again from ``record`` (a checkpoint of ``run_id``)."""
    found: list[list[Any]] = []
    for task in record.tasks():
        found.append([task.node, task.arg] if task.send else [task.node])
    return Seed(run_id, record.step, found)


def same_delta(a: Record, b: Record) -> bool:
    """Whether two checkpoints changed the same fields to the same encoded
    values: then two states equal before them are equal after them too
    (what ``first_divergence`` of two long runs uses to skip decoding)."""
    return (a.versions.keys() == b.versions.keys()
            and _raw(a.set) == _raw(b.set) and _raw(a.add) == _raw(b.add))


def _raw(fields: Mapping[str, msgspec.Raw]) -> dict[str, bytes]:
    return {k: bytes(v) for k, v in fields.items()}


def edited(schema: Schema, state: Mapping[str, Any], update: Any) -> dict[str, Any]:
    """``state`` with ``update``'s fields set (replacing each, as an
    interrupt's edit does), each value validated as its field's type;
    ``InvalidArgument`` naming the field otherwise (nothing is created)."""
    if update is None:
        return dict(state)
    if isinstance(update, Mapping):
        fields = dict(update)
    elif schema.kind != "typeddict" and isinstance(update, schema.cls):
        fields = schema.fields_of(update)
    else:
        raise InvalidArgument(f"the fork's update is a {type(update).__name__}: give a dict of the fields "
                              f"of {schema.name} it sets")
    for key in fields:
        if key not in schema.fields:
            raise InvalidArgument(f"the fork's update is invalid: {key!r} is not a field of {schema.name} "
                                  f"(fields: {', '.join(schema.fields)})")
    out = dict(state)
    for name, value in fields.items():
        field = schema.fields[name]
        try:
            out[name] = field.validate(value, field.type, lambda: "the fork's update is invalid")
        except GraphError as exc:
            raise InvalidArgument(str(exc)) from None
    return out


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a run was forked from: super-step ``step`` of run ``run_id``
    (``edited``: a fork with an edited state; else a replay)."""

    run_id: str
    step: int
    edited: bool

    def describe(self) -> str:
        return f"{'forked' if self.edited else 'replayed'} from {self.run_id} at step {self.step}"

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "edited": self.edited}


def origin(run_id: str, step: int, edited: bool) -> dict[str, Any]:
    """What ``NewRun.origin`` records of a replay or a fork."""
    return {"run_id": run_id, "step": step, "edited": edited}


def lineage_of(created: HistoryEvent | None) -> Lineage | None:
    """The lineage a run's ``run.created`` entry records, if any."""
    found = (created.detail or {}).get("forked_from") if created is not None else None
    if not isinstance(found, dict):
        return None
    run_id, step = found.get("run_id"), found.get("step")
    if not isinstance(run_id, str) or isinstance(step, bool) or not isinstance(step, int):
        return None
    return Lineage(run_id, step, bool(found.get("edited")))
