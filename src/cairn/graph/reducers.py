"""The built-in reducers of a graph's state fields.

A reducer says how a node's update of a field meets the field's value:
``(old, new) -> value``. Without one a field is replaced. ``append`` and
``merge`` are named functions (not lambdas) so that a graph's bundle names
them (``engine.bundles``: code outside the user's package counts by its
qualified name) and so that the checkpoint writer can tell an append from
any other change without comparing lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def append(old: Any, new: Any) -> list[Any]:
    """The list ``old`` followed by ``new``'s items (a list or tuple), or by
    ``new`` itself (any other value: one item)."""
    items = list(new) if isinstance(new, list | tuple) else [new]
    return [*(old or ()), *items]


def merge(old: Any, new: Any) -> dict[Any, Any]:
    """The dict ``old`` updated with ``new``'s keys (shallow: a key's value is replaced)."""
    if not isinstance(new, Mapping):
        raise TypeError(f"merge takes a mapping, not {type(new).__name__}")
    return {**(old or {}), **new}


def appended_items(new: Any) -> list[Any]:
    """The items an ``append`` update adds (what ``append`` puts after the old list)."""
    return list(new) if isinstance(new, list | tuple) else [new]
