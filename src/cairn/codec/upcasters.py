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
Versions apply to a payload's own type (a step's result, a child's result),
not to types nested inside it.

Upcasters are process-wide, like the types they convert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
        data = step(data)
        if not isinstance(data, dict):
            raise IncompatiblePayload(type_.__qualname__, found, current,
                                      f"the upcaster from version {version} did not return an object")
        data.pop(VERSION_KEY, None)
        version += 1
    return data


def unregister(type_: type, from_version: int) -> None:
    """Forget the upcaster of ``type_`` from ``from_version`` (tests, reloads)."""
    _UPCASTERS.pop((type_, from_version), None)
