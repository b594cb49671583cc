"""A wrapper's attributes read from the object it wraps, without a ``__getattr__`` hook.

``SealedStore`` hands every attribute it does not define itself to its inner
store. A ``__getattr__`` did that, but on CPython a class with one has its
attribute lookups taken off the specialized path: every lookup on the
wrapper, its own methods included (the engine's ``store.append``, a step's
sealing reading ``self._hot``), went through the generic hook, a few hundred
instructions each, eleven a 3-step run. Instead the wrapper's class gets one
small descriptor per name the inner store has (its class's, its own at
wrapping, any set through the wrapper later): a lookup of the wrapper's own
names is the interpreter's plain one, and a forwarded name still reads the
inner store at the time of the lookup, so a method set on the inner store
later (a test's fault, say) is the one called.
"""

from __future__ import annotations

from typing import Any


class Forward:
    """``wrapper.NAME`` is ``wrapper.inner.NAME``, read at each lookup."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, wrapper: Any, owner: type | None = None) -> Any:
        if wrapper is None:
            return self
        return getattr(wrapper.inner, self.name)


def _forward_any(self: Any, name: str) -> Any:
    """The fallback of a wrapper whose inner object resolves names itself (its own ``__getattr__``)."""
    return getattr(self.inner, name)


_classes: dict[tuple[type, type], type] = {}


def forwarding_class(wrapper: type, inner: type) -> type:
    """``wrapper`` subclassed to forward what ``inner``'s instances have (one class per pair, kept)."""
    made = _classes.get((wrapper, inner))
    if made is None:
        body: dict[str, Any] = {"__slots__": (), "__module__": wrapper.__module__,
                                "__qualname__": wrapper.__qualname__}
        if hasattr(inner, "__getattr__"):  # names it makes up are not known ahead: the hook stays
            body["__getattr__"] = _forward_any
        made = _classes[(wrapper, inner)] = type(wrapper.__name__, (wrapper,), body)
        forward(made, dir(inner))
    return made


def forward(cls: type, names: Any) -> None:
    """Give ``cls`` a ``Forward`` for each of ``names`` it has no attribute of (dunders are Python's)."""
    for name in names:
        if not (name.startswith("__") and name.endswith("__")) and not hasattr(cls, name):
            setattr(cls, name, Forward(name))
