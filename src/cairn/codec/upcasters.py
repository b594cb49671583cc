"""State types that evolve: schema versions and upcasters.

A payload type declares its schema version with a class attribute
(``__cairn_version__ = 3``); a value of it is recorded with that version
(the key ``"__cairn_version__"`` in its JSON object). Decoding an older
payload into the type runs the chain of upcasters registered for it
(``@app.upcaster(Order, from_version=1)``: a function from the version-1
JSON object to the version-2 one), one version at a time. A payload with no
path to the current version (a missing link, or a version newer than the
code's) raises ``IncompatiblePayload`` naming the type and both versions:
the engine parks the run as ``incompatible`` instead of failing it, and
``cairn retry`` resumes it once the missing upcaster is deployed.

A payload recorded before its type declared a version reads as version 1.
Versions apply wherever a versioned type sits in a payload's type: the
payload's own type, an item of a list, tuple, set or dict, a field of a
dataclass, msgspec Struct or TypedDict, an ``Optional`` (``upcast_tree``
walks the annotation and the JSON together). A nested value recorded
without a version (by code before nested versions were recorded) is taken
as the current version if it fits the type, else as version 1. An upcaster
that raises is an ``IncompatiblePayload`` too (the run is parked, and a
fixed upcaster deployed resumes it), never the run's failure.

Upcasters are process-wide, like the types they convert.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Union

import msgspec

from cairn.errors import IncompatiblePayload

#: the key a versioned value's JSON object carries its schema version under
VERSION_KEY = "__cairn_version__"

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_UPCASTERS: dict[tuple[type, int], Upcaster] = {}


def schema_version(type_: Any) -> int | None:
    """The schema version ``type_`` declares, if it is a class that declares one."""
    if not isinstance(type_, type):
        return None
    version = type_.__dict__.get(VERSION_KEY, getattr(type_, VERSION_KEY, None))
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def register(type_: type, from_version: int, fn: Upcaster) -> None:
    """``fn`` turns a version ``from_version`` payload of ``type_`` into a
    version ``from_version + 1`` one."""
    current = schema_version(type_)
    if current is None:
        raise TypeError(f"{type_.__qualname__} declares no schema version: give it "
                        f"{VERSION_KEY} = N (a class attribute) to register upcasters")
    if not 1 <= from_version < current:
        raise ValueError(f"an upcaster of {type_.__qualname__} from version {from_version} is out of range: "
                         f"its current version is {current}")
    _UPCASTERS[(type_, from_version)] = fn


def upcast(type_: type, current: int, obj: Any) -> Any:
    """``obj`` (plain JSON of a ``type_`` payload) at version ``current``."""
    if not isinstance(obj, dict):
        return obj
    data = dict(obj)
    found = data.pop(VERSION_KEY, 1)
    if not isinstance(found, int) or isinstance(found, bool):
        raise IncompatiblePayload(type_.__qualname__, found, current, "its version is not a number")
    if found > current:
        raise IncompatiblePayload(type_.__qualname__, found, current,
                                  "it was recorded by newer code than this process runs")
    version = found
    while version < current:
        step = _UPCASTERS.get((type_, version))
        if step is None:
            raise IncompatiblePayload(type_.__qualname__, found, current,
                                      f"no upcaster from version {version} is registered")
        try:
            data = step(dict(data))
        except Exception as exc:  # a bug in the upcaster: deployable, so the run waits for the fix
            raise IncompatiblePayload(type_.__qualname__, found, current,
                                      f"the upcaster from version {version} raised {type(exc).__name__}: "
                                      f"{exc}") from None
        if not isinstance(data, dict):
            raise IncompatiblePayload(type_.__qualname__, found, current,
                                      f"the upcaster from version {version} did not return an object")
        data.pop(VERSION_KEY, None)
        version += 1
    return data


def unregister(type_: type, from_version: int) -> None:
    """Forget the upcaster of ``type_`` from ``from_version`` (tests, reloads)."""
    _UPCASTERS.pop((type_, from_version), None)


# -- versioned types nested in a payload's type ------------------------------------------------

#: whether a type's annotation tree holds a versioned type (cached per type)
_TREES: dict[Any, bool] = {}
_FIELDS: dict[type, dict[str, Any] | None] = {}
#: the fits check of ``upcast_tree``: does plain JSON ``obj`` convert into ``type_``
Fits = Callable[[Any, Any], bool]


def versioned_in(type_: Any) -> bool:
    """Whether ``type_`` is, or holds somewhere in its fields or items, a
    type that declares a schema version."""
    try:
        return _TREES[type_]
    except KeyError:
        found = _TREES[type_] = _scan(type_, set())
        return found
    except TypeError:  # an unhashable annotation
        return _scan(type_, set())


def _scan(type_: Any, seen: set[int]) -> bool:
    if id(type_) in seen:
        return False
    seen.add(id(type_))
    if schema_version(type_) is not None:
        return True
    if typing.get_origin(type_) is not None:
        return any(_scan(arg, seen) for arg in typing.get_args(type_) if arg is not Ellipsis)
    return any(_scan(field, seen) for field in (_fields(type_) or {}).values())


def _fields(cls: Any) -> dict[str, Any] | None:
    """A record type's fields as recorded (JSON name: annotation)."""
    if not isinstance(cls, type):
        return None
    if cls in _FIELDS:
        return _FIELDS[cls]
    found: dict[str, Any] | None = None
    try:
        if dataclasses.is_dataclass(cls):
            hints = typing.get_type_hints(cls)
            found = {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}
        elif issubclass(cls, msgspec.Struct):
            found = {f.encode_name: f.type for f in msgspec.structs.fields(cls)}
        elif typing.is_typeddict(cls):
            found = dict(typing.get_type_hints(cls))
    except Exception:  # unresolvable annotations: the type decodes as it can, nothing nested is upcast
        found = None
    _FIELDS[cls] = found
    return found


def upcast_tree(type_: Any, obj: Any, fits: Fits, nested: bool = False) -> Any:
    """``obj`` (plain JSON decoded as ``type_``) with every versioned value
    in it, the top one included, brought to its type's current version."""
    origin = typing.get_origin(type_)
    if origin is None:
        return _upcast_record(type_, obj, fits, nested)
    args = typing.get_args(type_)
    if origin is Annotated:
        return upcast_tree(args[0], obj, fits, nested)
    if origin is Union or origin is types.UnionType:
        candidates = [a for a in args if a is not type(None) and versioned_in(a)]
        if obj is None or len(candidates) != 1:
            return obj
        return upcast_tree(candidates[0], obj, fits, nested)
    if isinstance(obj, list) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return [upcast_tree(a, o, fits, True) for a, o in zip(args, obj, strict=False)] + obj[len(args):]
        return [upcast_tree(args[0], o, fits, True) for o in obj]
    if isinstance(obj, dict) and len(args) == 2 and origin is not tuple:
        return {k: upcast_tree(args[1], v, fits, True) for k, v in obj.items()}
    return obj


def _upcast_record(type_: Any, obj: Any, fits: Fits, nested: bool) -> Any:
    if not isinstance(obj, dict):
        return obj
    current = schema_version(type_)
    fields = _fields(type_)
    if current is not None:
        if nested and VERSION_KEY not in obj:  # recorded before nested values carried their version
            as_current = _upcast_fields(fields, obj, fits)
            if fits(as_current, type_):
                return as_current
        obj = upcast(type_, current, obj)
    return _upcast_fields(fields, obj, fits)


def _upcast_fields(fields: dict[str, Any] | None, obj: dict[str, Any], fits: Fits) -> dict[str, Any]:
    if not fields:
        return obj
    return {k: upcast_tree(fields[k], v, fits, True) if k in fields else v for k, v in obj.items()}


def mark_versions(type_: Any, value: Any, plain: Any) -> Any:
    """``plain`` (what ``value`` encodes to) with the schema version of
    every versioned value in it recorded in its object, found by walking
    ``type_`` (the type it will be decoded into) where it holds versioned
    types, and nowhere else."""
    if not versioned_in(type_):
        return plain
    origin = typing.get_origin(type_)
    if origin is None:
        return _mark_record(type_, value, plain)
    args = typing.get_args(type_)
    if origin is Annotated:
        return mark_versions(args[0], value, plain)
    if origin is Union or origin is types.UnionType:
        chosen = [a for a in args if isinstance(a, type) and isinstance(value, a) and versioned_in(a)]
        return mark_versions(chosen[0], value, plain) if len(chosen) == 1 else plain
    if isinstance(plain, list) and isinstance(value, list | tuple | set | frozenset) and args:
        items = list(value)
        if len(items) != len(plain) or isinstance(value, set | frozenset):
            return plain  # a set is recorded sorted: its items no longer line up with the value's
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return [mark_versions(a, v, p) for a, v, p in zip(args, items, plain, strict=False)] + \
                plain[len(args):]
        return [mark_versions(args[0], v, p) for v, p in zip(items, plain, strict=True)]
    if isinstance(plain, dict) and isinstance(value, dict) and len(args) == 2 and len(plain) == len(value):
        pairs = zip(plain.items(), value.values(), strict=True)
        return {k: mark_versions(args[1], v, p) for (k, p), v in pairs}
    return plain


def _mark_record(type_: Any, value: Any, plain: Any) -> Any:
    if not isinstance(plain, dict):
        return plain
    fields: dict[str, Any] | None = None
    if typing.is_typeddict(type_):
        fields = _fields(type_) if isinstance(value, dict) else None
    elif isinstance(type_, type) and isinstance(value, type_):
        fields = _fields(type(value))  # a subclass's fields, if it is one
    for name, annotation in (fields or {}).items():
        if name in plain and versioned_in(annotation):
            attribute = _attribute(type(value), name) if isinstance(value, msgspec.Struct) else name
            inner = value.get(name) if isinstance(value, dict) else getattr(value, attribute, None)
            plain[name] = mark_versions(annotation, inner, plain[name])
    version = schema_version(type(value))
    if version is not None:
        plain[VERSION_KEY] = version
    return plain


def _attribute(cls: type, encode_name: str) -> str:
    for field in msgspec.structs.fields(cls):
        if field.encode_name == encode_name:
            return field.name
    return encode_name
