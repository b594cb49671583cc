"""The checkpoint of a super-step: its format, how one is written from two
states, and how the state at any checkpoint is read back.

A checkpoint is one journal entry of the run (``step.completed``, kind
``graph``, name ``step <n>``) whose payload is the JSON below, so it is
written by the engine's fenced commit path like every other record (a stale
worker's checkpoint is refused with its append) and goes to the artifact
store by reference when it is large, as every payload does::

    {"v": 1, "step": 3, "parent": 2,            # super-step; the one before it
     "nodes": ["a", "b"],                        # the tasks that ran (task order)
     "next": [["c"], ["d", <arg>]],              # the next super-step's tasks (a Send's arg)
     "set": {"summary": <value>},                # fields whose value changed, as their new value
     "add": {"messages": [<item>, ...]},         # list fields that only grew: the new items
     "versions": {"messages": [3, 0], "summary": [3, 3]},
     "sv": 2,                                    # the state type's schema version, if it declares one
     "run": "r1"}                                # the run that wrote it

A field that did not change is in neither ``set`` nor ``add``; a key whose
value is its default (no ``set``, no ``parent``, no ``sv``) is left out.
``versions`` is the reference snapshot, carried by every checkpoint (a few
bytes a field, nothing copied): for each field, the super-step that last
changed it and the one that last *set* it whole (the base; for a field that
is never appended, the same step). The value of a field at step ``k`` is the
``set`` value at its base, followed, for a list, by the ``add`` items of the
checkpoints after the base up to its last change. Reading any state never
folds from the start and never applies a reducer: it reads the checkpoint,
the ones its versions name, and a list's appends (which are that list).

A state type that evolves declares a schema version (``__cairn_version__``,
``codec.upcasters``), which every checkpoint records as ``sv``. The state
at a checkpoint of an older version is read whole as plain JSON
(``Chain.state`` without a schema) and decoded as the state type, which runs its upcasters
(``IncompatiblePayload`` when no chain of them reaches the current version:
the run is parked, never failed). The first checkpoint a new version writes
sets every field (``write(..., before={})``), so no checkpoint's state
mixes records of two versions.

A checkpoint is checked as it is read, since a row can be damaged behind
Cairn's back (a bad restore, a disk, SQL): ``decode`` checks it alone (its
format, that it is the super-step and the run its entry says, that its
versions point at no later super-step and agree with what it sets and
appends, that its next tasks name nodes) and ``Chain.record`` against the
checkpoint before it (which must be in the run's history: a deleted row
is a gap, not a state read without that row's items; a field it did not
change has the same version in both). ``Chain.state`` checks that each
version it follows names a checkpoint that changed the field that way.
Each refusal is a one-line ``PayloadError`` naming the checkpoint (run and
super-step): a resumed run is parked ``incompatible``, a read refused,
never a wrong state returned.

The names follow LangGraph's checkpoint (next issue): ``versions`` are its
``channel_versions``, ``set``/``add`` its per-channel blobs, ``parent`` its
parent checkpoint, ``nodes`` and ``step`` its metadata; pending writes are the
journal entries of the super-step that has not committed yet.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from cairn.codec import upcasters, values
from cairn.errors import PayloadError
from cairn.graph.errors import cut
from cairn.graph.state import Records, Schema, _list_of

#: the ``step_kind`` of a checkpoint's journal entry
KIND = "graph"
VERSION = 1


def entry_name(step: int) -> str:
    """The journal name of super-step ``step``'s checkpoint."""
    return f"step {step}"


def step_of(name: str | None) -> int | None:
    """The super-step an entry named ``name`` checkpoints (``None``: not a checkpoint name)."""
    if name is None or not name.startswith("step "):
        return None
    try:
        return int(name[5:])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Task:
    """A node to run in a super-step, with a ``Send``'s argument (or the state)."""

    node: str
    arg: Any = None
    send: bool = False


class Record(msgspec.Struct, frozen=True, omit_defaults=True):
    """A checkpoint as stored (field values left encoded until read as their type)."""

    v: int
    step: int
    nodes: list[str]
    next: list[list[msgspec.Raw]]
    versions: dict[str, list[int]]
    parent: int | None = None
    set: dict[str, msgspec.Raw] = {}
    add: dict[str, msgspec.Raw] = {}
    #: the schema version of the state type that wrote it (``None``: it declares none)
    sv: int | None = None
    #: the run that wrote it (``None``: written before runs were recorded; a row of
    #: another run's copied into this run's history is refused by it)
    run: str | None = None

    def tasks(self) -> list[Task]:
        """The next super-step's tasks, decoded (a ``Send``'s arg as plain
        JSON; ``decode`` checked each is ``[name]`` or ``[name, arg]``)."""
        found = []
        for task in self.next:
            name = msgspec.json.decode(task[0], type=str)
            if len(task) > 1:
                found.append(Task(name, values.decode(task[1], what=f"the input of node {name!r}"), True))
            else:
                found.append(Task(name))
        return found

    def node_names(self) -> list[str]:
        """The nodes the next super-step runs (without a ``Send``'s arg)."""
        return [msgspec.json.decode(task[0], type=str) for task in self.next]


_DECODER = msgspec.json.Decoder(Record)
#: list types whose items no reader can change: their decoded appends may be shared
_IMMUTABLE: dict[Any, bool] = {_list_of(t): True for t in (str, int, float, bool)}
#: the types of items a plain-JSON read may share (what JSON decodes to that cannot be changed)
_ATOMS = frozenset({str, int, float, bool, type(None)})


class Appended:
    """The items a list field gained after its base, decoded once, in
    order: ``ends[i]`` is how many of them ``steps[i]`` and the appends
    before it hold, and ``upto`` the last super-step taken in. A reader
    shares one per (field, base, item type) between reads, so the state at
    any checkpoint up to ``upto`` is the base value and a slice of
    ``items`` (a copy at C speed), neither decoded nor walked again."""

    __slots__ = ("ends", "items", "steps", "upto")

    def __init__(self, base: int) -> None:
        self.items: list[Any] = []
        self.steps: list[int] = []
        self.ends: list[int] = []
        self.upto = base

    def count_at(self, step: int) -> int:
        """How many items the appends up to ``step`` (at most ``upto``) hold."""
        i = bisect.bisect_right(self.steps, step)
        return self.ends[i - 1] if i else 0


class Shared:
    """The ``Appended`` of one run's reader, by (field, base, item list
    type; ``None``: that field's items cannot be shared), and the lock under
    which a read extends one (readers of one run may be threads of a server)."""

    def __init__(self) -> None:
        self.by: dict[tuple[str, int, Any], Appended | None] = {}
        self.lock = threading.Lock()
_ENCODER = msgspec.json.Encoder()


def what_of(run_id: str, step: int) -> str:
    """How an error names checkpoint ``step`` of run ``run_id``."""
    return f"checkpoint {step} of run {run_id!r}"


def damaged(what: str, why: str) -> PayloadError:
    """The error for a checkpoint that is not what it should be (one line)."""
    return PayloadError(f"{what} is damaged: {cut(why)}")


def decode(raw: bytes, what: str = "a graph checkpoint", *, step: int | None = None,
           run: str | None = None) -> Record:
    """The checkpoint ``raw``, checked alone (``what`` names it in errors):
    that it is super-step ``step`` of run ``run`` (when given) and that its
    versions, what it sets and appends, its parent and its next tasks agree."""
    try:
        record = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PayloadError(f"{what} cannot be read: {cut(str(exc))}") from None
    if record.v != VERSION:
        raise PayloadError(f"{what} is of format {record.v}, which this code cannot read (it reads format "
                           f"{VERSION})")
    at = record.step
    if step is not None and at != step:
        raise damaged(what, f"it holds super-step {at}")
    if run is not None and record.run is not None and record.run != run:
        raise damaged(what, f"it was written by run {record.run!r}")
    if record.parent is not None and record.parent != at - 1:
        raise damaged(what, f"its parent is {record.parent}, not super-step {at - 1}")
    for name, version in record.versions.items():
        if len(version) != 2 or not 0 <= version[1] <= version[0] <= at:
            raise damaged(what, f"field {name!r} has version {version}, not [last changed, last set] with "
                                f"0 <= last set <= last changed <= {at}")
        changed, base = version
        if record.parent is None and changed != at:
            raise damaged(what, f"it is its run's first checkpoint and does not set field {name!r}")
        if (changed == at and base == at) != (name in record.set) or (changed == at and base < at) != (
                name in record.add):
            raise damaged(what, f"field {name!r} has version {version}, which what it sets and appends "
                                "contradicts")
    for name in (*record.set, *record.add):
        if name not in record.versions:
            raise damaged(what, f"it changes field {name!r}, which has no version")
    for task in record.next:
        if not 1 <= len(task) <= 2:
            raise damaged(what, "a next task is not [node] or [node, arg]")
        try:
            msgspec.json.decode(task[0], type=str)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise damaged(what, "a next task does not name a node") from None
    return record


def check_link(record: Record, parent: Record | None, what: str, steps: Sequence[int]) -> None:
    """``record`` against the checkpoint before it: the parent must be in
    the run's history (``steps``: else a row is missing, and a state read
    across the gap would lack its items), and a field ``record`` did not
    change has the same version in both (one it appended to, the same base)."""
    if record.parent is None:
        if steps and steps[0] != record.step:
            raise damaged(what, f"it has no parent, yet checkpoint {steps[0]} comes before it")
        return
    if parent is None:
        raise damaged(what, f"it follows checkpoint {record.parent}, which is not in the run's history "
                            "(a row is missing)")
    at = record.step
    for name, (changed, base) in record.versions.items():
        before = parent.versions.get(name)
        if changed < at and before != [changed, base]:
            raise damaged(what, f"field {name!r} has version {[changed, base]}, but checkpoint {parent.step} "
                                f"before it says {before}")
        if changed == at and base < at and (before is None or before[1] != base):
            raise damaged(what, f"field {name!r} is appended to since super-step {base}, but checkpoint "
                                f"{parent.step} before it says {before}")


def write(schema: Schema, step: int, nodes: Sequence[str], before: Mapping[str, Any],
          after: Mapping[str, Any], added: Mapping[str, list[Any]], tasks: Sequence[Task],
          versions: dict[str, list[int]], parent: int | None, run: str | None = None,
          records: Records | None = None) -> bytes:
    """The checkpoint of super-step ``step`` of run ``run``, which took the
    state from ``before`` to ``after`` (``added``: the items
    ``cairn.append`` fields gained); ``versions`` is updated in place.
    ``records``: a value's (or appended items') record, already encoded as
    it was validated (``Schema.apply``), used when the value stored is that
    very object and cannot have changed since (the routers, which ran
    after it was validated, see the state: a list or a dict they changed
    in place is encoded again, as it is now)."""
    known = records or {}
    sets: dict[str, msgspec.Raw] = {}
    adds: dict[str, msgspec.Raw] = {}
    for name, field in schema.fields.items():
        if name not in after:
            continue
        new = after[name]
        if name not in before:
            sets[name] = msgspec.Raw(values.encode(new, field.type))
            versions[name] = [step, step]
            continue
        old = before[name]
        if field.appends and name in added:
            items: list[Any] | None = added[name]
        elif new is old or new == old:
            continue
        elif (field.item_type is not None and isinstance(new, list) and isinstance(old, list)
              and len(new) > len(old) and new[:len(old)] == old):
            items = new[len(old):]
        else:
            items = None
        # the record validated, for a value no router could have changed since (text, a number)
        cached = known.get(name)
        if items is None:
            raw = (cached[1] if cached is not None and cached[0] is new and type(new) in _ATOMS
                   else values.encode(new, field.type))
            sets[name] = msgspec.Raw(raw)
            versions[name] = [step, step]
        elif items:
            raw = (cached[1] if cached is not None and cached[0] is items and set(map(type, items)) <= _ATOMS
                   else values.encode(items, _list_of(field.item_type)))
            adds[name] = msgspec.Raw(raw)
            versions[name] = [step, versions.get(name, [step, step])[1]]
    next_tasks = [[msgspec.Raw(_ENCODER.encode(t.node)), msgspec.Raw(values.encode(t.arg))] if t.send
                  else [msgspec.Raw(_ENCODER.encode(t.node))] for t in tasks]
    record = Record(VERSION, step, list(nodes), next_tasks, dict(versions), parent, sets, adds,
                    schema.version, run)
    return _ENCODER.encode(record)


class Chain:
    """The checkpoints of one run, read by super-step (``load(step)``
    returns its record, decoded and checked alone): the state at any of
    them, by reference. ``what(step)`` names a checkpoint in errors."""

    def __init__(self, steps: Sequence[int], load: Callable[[int], Record],
                 shared: Shared | None = None, what: Callable[[int], str] | None = None) -> None:
        self.steps = sorted(steps)
        self._present = frozenset(self.steps)
        self._load = load
        self._what = what or (lambda step: f"checkpoint {step}")
        #: decoded records (checked alone), and those also checked against their parent
        self._loaded: dict[int, Record] = {}
        self._cache: dict[int, Record] = {}
        #: decoded appends of immutable items (text, numbers): a reader
        #: shares them between reads, since no caller can change them; the
        #: reader drops them when an operator's retry or rewind voids
        #: checkpoints (the steps they were read from may then hold others)
        self._shared = shared

    def record(self, step: int) -> Record:
        """Checkpoint ``step``, checked alone and against the one before it."""
        found = self._cache.get(step)
        if found is None:
            found = self._decoded(step)
            parent = found.parent
            if parent is None or parent not in self._present:
                check_link(found, None, self._what(step), self.steps)
            else:
                try:
                    before = self._decoded(parent)
                except PayloadError:  # the parent's own error, when a read needs it; this one reads
                    pass
                else:
                    check_link(found, before, self._what(step), self.steps)
            self._cache[step] = found
        return found

    def _decoded(self, step: int) -> Record:
        found = self._loaded.get(step)
        if found is None:
            found = self._loaded[step] = self._load(step)
        return found

    def latest(self) -> int | None:
        return self.steps[-1] if self.steps else None

    def state(self, schema: Schema | None, step: int, what: str,
              only: Collection[str] | None = None) -> dict[str, Any]:
        """The state after super-step ``step``, each field decoded as its type
        (``PayloadError`` naming ``what`` and the field if one cannot be, or
        a required field that it lacks; ``IncompatiblePayload`` if an older
        version's state has no upcaster to the current one); without
        ``schema`` (a reader without the graph's code: the CLI, the HTTP API)
        as plain JSON, which the versions alone allow: a field whose last
        change is not its base is a list that grew. With ``only``, just
        those fields (a diff's, whose versions differ)."""
        record = self.record(step)
        if schema is not None and schema.version is not None and record.sv != schema.version:
            return self._upcast(schema, step, record.sv, what)
        state: dict[str, Any] = {}
        for name, (changed, base) in record.versions.items():
            if only is not None and name not in only:
                continue
            field = None if schema is None else schema.fields.get(name)
            if schema is not None and field is None:  # a field the state type no longer has
                continue
            type_ = Any if field is None else field.type
            described = f"field {name!r} of {what}"
            last = record if changed == step else self._follow(step, name, changed, base)
            if changed == base:
                state[name] = values.decode(last.set[name], type_, what=described)
                continue
            if field is not None and field.item_type is None:
                raise PayloadError(f"cannot decode {described}: it was appended to, and "
                                   f"{schema_name(schema)} no longer declares it a list")
            first = self._follow(changed, name, base, base)
            value = values.decode(first.set[name], type_, what=described)
            if not isinstance(value, list):
                raise damaged(self._what(base), f"field {name!r} is appended to later but is not a list")
            item_list = _list_of(Any if field is None else field.item_type)
            appended = self._appended(name, base, changed, item_list, described)
            if appended is None:
                value.extend(self._decode_appends(name, base, changed, item_list, described))
            else:
                value.extend(appended.items[:appended.count_at(changed)])
            state[name] = value
        return state if schema is None or only is not None else _complete(schema, state, what)

    def _follow(self, step: int, name: str, changed: int, base: int) -> Record:
        """Checkpoint ``changed``, which checkpoint ``step``'s version of
        ``name`` names: it must be in the run and have changed the field so."""
        if changed not in self._present:
            raise damaged(self._what(step), f"field {name!r} was last changed at super-step {changed}, which "
                                            "has no checkpoint in the run's history")
        found = self.record(changed)
        if found.versions.get(name) != [changed, base]:
            raise damaged(self._what(step), f"field {name!r} was last changed at super-step {changed}, but "
                                            f"checkpoint {changed} says {found.versions.get(name)}")
        return found

    def _decode_appends(self, name: str, base: int, changed: int, item_list: Any,
                        described: str) -> list[Any]:
        """The items field ``name`` gained after ``base`` up to ``changed``, decoded now."""
        items: list[Any] = []
        low = bisect.bisect_right(self.steps, base)
        high = bisect.bisect_right(self.steps, changed)
        for later in self.steps[low:high]:  # each checked against its parent: a missing row is a gap
            raw = self.record(later).add.get(name)
            if raw is not None:
                items.extend(values.decode(raw, item_list, what=described))
        return items

    def _appended(self, name: str, base: int, changed: int, item_list: Any,
                  described: str) -> Appended | None:
        """The shared appends of field ``name`` since ``base``, taken in up
        to ``changed`` (``None``: not shared by this chain, or items a caller
        could change: each read decodes its own)."""
        if self._shared is None:
            return None
        with self._shared.lock:
            return self._extended(self._shared.by, name, base, changed, item_list, described)

    def _extended(self, shared: dict[tuple[str, int, Any], Appended | None], name: str, base: int,
                  changed: int, item_list: Any, described: str) -> Appended | None:
        key = (name, base, item_list)
        if key in shared:
            found = shared[key]
            if found is None:
                return None
        else:
            found = Appended(base)
        if found.upto >= changed:
            return found
        # as far as the latest checkpoint still has this base: the reads after this one are slices
        try:
            latest = self.record(self.steps[-1]).versions.get(name)
        except PayloadError:  # a damaged latest checkpoint fails the reads that need it, not this one
            latest = None
        upto = max(changed, latest[0]) if latest is not None and latest[1] == base else changed
        typed = _IMMUTABLE.get(item_list, False)
        low = bisect.bisect_right(self.steps, found.upto)
        high = bisect.bisect_right(self.steps, upto)
        items: list[Any] = []
        steps: list[int] = []
        ends: list[int] = []
        for index in range(low, high):  # all decoded before any is taken in (one may fail)
            later = self.steps[index]
            try:
                raw = self.record(later).add.get(name)
                decoded = None if raw is None else values.decode(raw, item_list, what=described)
            except PayloadError:
                if later <= changed:
                    raise
                upto = max(found.upto, self.steps[index - 1])  # reading ahead: stop before a damaged one
                break
            if decoded is None:
                continue
            if not typed and not set(map(type, decoded)) <= _ATOMS:
                shared[key] = None  # dicts or lists inside: a caller may change them
                return None
            items.extend(decoded)
            steps.append(later)
            ends.append(len(found.items) + len(items))
        found.items.extend(items)
        found.steps.extend(steps)
        found.ends.extend(ends)
        found.upto = upto
        shared[key] = found
        return found

    def _upcast(self, schema: Schema, step: int, found: int | None, what: str) -> dict[str, Any]:
        """The state of an older version's checkpoint, through the state type's upcasters."""
        plain = self.state(None, step, what)
        plain[upcasters.VERSION_KEY] = 1 if found is None else found  # no version recorded: version 1
        decoded = values.decode(msgspec.json.encode(plain), schema.cls, what=what)
        return _complete(schema, schema.fields_of(decoded), what)



def schema_name(schema: Schema | None) -> str:
    return "the state type" if schema is None else schema.name


def _complete(schema: Schema, state: dict[str, Any], what: str) -> dict[str, Any]:
    """``state``, if it has every field the state type requires (a type that
    gained one since the checkpoint was written no longer reads it: a
    ``PayloadError``, which parks a resuming run until an upcaster is deployed)."""
    missing = [name for name, field in schema.fields.items() if field.required and name not in state]
    if missing:
        raise PayloadError(f"cannot decode {what}: it has no {', '.join(map(repr, missing))} (a field "
                           f"{schema.name} requires now; declare __cairn_version__ and an upcaster)")
    return state
