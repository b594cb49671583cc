"""A graph's state type, read once: its fields, their types and reducers.

The state is a ``TypedDict``, a dataclass or a pydantic model. Inside the
runner it is a plain ``dict`` of field values, each one already validated
as its field's type (encoded and decoded back, as every recorded value is,
so a node sees after a resume exactly what it saw the first time); nodes
receive it as the user's type (``Schema.view``).
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cairn.codec import upcasters, values
from cairn.errors import PayloadError
from cairn.graph import reducers
from cairn.graph.errors import GraphError, InvalidGraph, cut

Reducer = Callable[[Any, Any], Any]
#: a field's validated value (or appended items) and the record it was decoded from, by field
Records = dict[str, tuple[Any, bytes]]


@dataclass(frozen=True, slots=True)
class Field:
    """One field of the state."""

    name: str
    #: the annotation, ``Annotated`` stripped: what a value must decode as
    type: Any
    #: ``None``: an update replaces the value
    reducer: Reducer | None
    #: the item type when ``type`` is a list (``Any`` for a bare ``list``),
    #: else ``None``: such a field is checkpointed as appends while it only grows
    item_type: Any
    required: bool

    @property
    def appends(self) -> bool:
        return self.reducer is reducers.append

    def validate(self, value: Any, as_type: Any, what: Callable[[], str]) -> Any:
        """``value`` as ``as_type`` decodes it back from its record: the form
        stored and the form every node sees, first run and replay alike."""
        return self.validated(value, as_type, what)[0]

    def validated(self, value: Any, as_type: Any, what: Callable[[], str]) -> tuple[Any, bytes]:
        """``validate``'s value and the record it was decoded from (which the
        checkpoint stores rather than encoding the value a second time)."""
        try:
            raw = values.encode(value, as_type)
            return values.decode(raw, as_type, what="it"), raw
        except PayloadError as exc:
            raise GraphError(f"{what()}: field {self.name!r}: {exc}") from None


def _reducer_of(name: str, metadata: tuple[Any, ...]) -> Reducer | None:
    found = [m for m in metadata if callable(m) and not isinstance(m, type)]
    if len(found) > 1:
        raise InvalidGraph(f"field {name!r} names {len(found)} reducers; give it one")
    return found[0] if found else None


def _item_type(type_: Any) -> Any:
    origin = typing.get_origin(type_)
    if type_ is list:
        return Any
    if origin is list:
        args = typing.get_args(type_)
        return args[0] if args else Any
    return None


def _list_of(item: Any) -> Any:
    return list[item]


def _is_dict(type_: Any) -> bool:
    return type_ is dict or typing.get_origin(type_) is dict or type_ is Any


def _is_pydantic(cls: type) -> bool:
    pydantic = sys.modules.get("pydantic")  # never imported here: a TypedDict state needs none
    return pydantic is not None and isinstance(cls, type) and issubclass(cls, pydantic.BaseModel)


class Schema:
    """The state type of a graph and what the runner needs of it."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        self.kind = self._kind(cls)
        #: the schema version the state type declares (``__cairn_version__``), recorded in
        #: every checkpoint: an older one is read through the type's upcasters
        self.version = upcasters.schema_version(cls)
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception as exc:
            raise InvalidGraph(f"state type {getattr(cls, '__qualname__', cls)!r}: cannot read its "
                               f"annotations: {exc}") from None
        names, required = self._names(cls, hints)
        self.fields: dict[str, Field] = {}
        for name in names:
            annotation = hints.get(name, Any)
            metadata: tuple[Any, ...] = ()
            if typing.get_origin(annotation) is typing.Annotated:
                metadata = tuple(annotation.__metadata__)
                annotation = annotation.__origin__
            reducer = _reducer_of(name, metadata)
            item = _item_type(annotation)
            if reducer is reducers.append and item is None:
                raise InvalidGraph(f"field {name!r}: cairn.append needs a list field, not {annotation!r}")
            if reducer is reducers.merge and not _is_dict(annotation):
                raise InvalidGraph(f"field {name!r}: cairn.merge needs a dict field, not {annotation!r}")
            try:
                values.decoder_for(annotation)
            except Exception as exc:
                raise InvalidGraph(f"field {name!r}: its type cannot be recorded: {exc}") from None
            self.fields[name] = Field(name, annotation, reducer, item, name in required)

    @staticmethod
    def _kind(cls: Any) -> str:
        if isinstance(cls, type) and issubclass(cls, dict) and hasattr(cls, "__annotations__") \
                and hasattr(cls, "__total__"):
            return "typeddict"
        if dataclasses.is_dataclass(cls) and isinstance(cls, type):
            return "dataclass"
        if _is_pydantic(cls):
            return "pydantic"
        raise InvalidGraph(f"a graph's state is a TypedDict, a dataclass or a pydantic model, not {cls!r}")

    def _names(self, cls: Any, hints: dict[str, Any]) -> tuple[list[str], set[str]]:
        if self.kind == "typeddict":
            return list(hints), set(cls.__required_keys__)
        if self.kind == "dataclass":
            fields = [f for f in dataclasses.fields(cls) if f.init]
            return [f.name for f in fields], {
                f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        model_fields = cls.model_fields
        return list(model_fields), {n for n, f in model_fields.items() if f.is_required()}

    @property
    def name(self) -> str:
        return str(getattr(self.cls, "__qualname__", self.cls))

    # -- the state as the runner holds it, and as nodes see it -------------------------

    def initial(self, value: Any) -> dict[str, Any]:
        """The state a run starts with: ``value`` (the user's type, or a
        mapping of its fields) validated as the state type."""
        try:
            decoded = values.decode(values.encode(value, self.cls), self.cls, what="it")
        except PayloadError as exc:
            raise GraphError(f"the input is not a valid {self.name}: {exc}") from None
        return self.fields_of(decoded)

    def fields_of(self, value: Any) -> dict[str, Any]:
        """The field values of ``value`` (an instance of the state type)."""
        if isinstance(value, Mapping):
            return {name: value[name] for name in self.fields if name in value}
        return {name: getattr(value, name) for name in self.fields if hasattr(value, name)}

    def view(self, state: Mapping[str, Any]) -> Any:
        """``state`` as the user's type (fields already validated: not checked again)."""
        if self.kind == "typeddict":
            return dict(state)
        if self.kind == "pydantic":
            return self.cls.model_construct(**state)
        return self.cls(**state)

    def result_type(self) -> Any:
        return self.cls

    # -- updates --------------------------------------------------------------------

    def update_of(self, node: str, returned: Any) -> dict[str, Any]:
        """What node ``node`` returned, as ``{field: value}`` (not yet validated)."""
        if returned is None:
            return {}
        if isinstance(returned, Mapping):  # not a whole state: its lists would be appended again
            update = dict(returned)
        else:
            raise GraphError(f"node {node!r} returned a {type(returned).__name__}: a node returns a dict "
                             f"of the fields of {self.name} it updates (or None)")
        for key in update:
            if key not in self.fields:
                raise GraphError(f"node {node!r} returned an invalid update: {key!r} is not a field of "
                                 f"{self.name} (fields: {', '.join(self.fields)})")
        return update

    def apply(self, node: str, state: dict[str, Any], update: Mapping[str, Any],
              added: dict[str, list[Any]], records: Records | None = None) -> None:
        """Apply node ``node``'s ``update`` to ``state`` in place, validating
        each value; the items appended by ``cairn.append`` fields go to
        ``added`` too (the checkpoint stores only those). ``records``: for a
        field one update of the super-step set or appended to, the value (or
        the list of items) and its record, which the checkpoint stores as it
        is if the value is still that very object (``checkpoints.write``)."""
        def what() -> str:
            return f"node {node!r} returned an invalid update"

        for name, new in update.items():
            field = self.fields[name]
            if field.appends:
                items, raw = field.validated(reducers.appended_items(new), _list_of(field.item_type), what)
                state[name] = [*state.get(name, ()), *items]
                if name in added:  # a second update of the super-step: its record is no longer the items'
                    added[name].extend(items)
                    if records is not None:
                        records.pop(name, None)
                else:
                    added[name] = items
                    if records is not None:
                        records[name] = (items, raw)
                continue
            if records is not None:
                records.pop(name, None)
            if field.reducer is None:
                state[name], raw = field.validated(new, field.type, what)
                if records is not None:
                    records[name] = (state[name], raw)
                continue
            try:
                reduced = field.reducer(state.get(name), new)
            except Exception as exc:
                raise GraphError(f"node {node!r}: the reducer of field {name!r} raised "
                                 f"{type(exc).__name__}: {cut(str(exc))}") from None
            state[name] = field.validate(reduced, field.type, what)
