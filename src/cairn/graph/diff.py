"""A typed diff of two graph states, and the first super-step where two runs diverge.

States are plain values: dicts of fields whose values are JSON-like (dict,
list, str, int, float, bool, None); dataclass and pydantic instances count as
the dicts of their fields, tuples as lists. Two values are *equal* when they
would encode to the same JSON, key order aside: ``1``, ``1.0`` and ``True``
differ (Python's ``==`` says they are equal), a dataclass equals the dict of
its fields.

:func:`diff` reports, per path from the root (``("messages",)``,
``("profile", "address", "city")``, ``("items", 3)``), what changed:

* ``added`` / ``removed``: a dict key (a state field) that only the new / the
  old value has; ``new`` / ``old`` is its value;
* ``replaced``: the value at the path is another one, ``old`` -> ``new``
  (a different scalar, a type change such as list -> dict or None -> 0, or a
  list changed in more than one place);
* ``appended``: the list at the path kept every old item and grew at its end;
  ``new`` is the list of added items (``old`` is None);
* ``inserted`` / ``deleted``: one run of items inserted / deleted at the index
  ending the path (``("items", 3)``); ``new`` / ``old`` is the list of them.

A list whose length did not change and whose items differ is diffed item by
item, so a change inside a list of dicts gets the nested path. Unchanged
fields are absent. Path elements are the keys themselves, never joined into a
string: ``"a.b"`` is one key, and ``"0"`` (a key) is not ``0`` (an index).

Speed matters because a graph's message list is long and usually only grew:
the common prefix of two lists is checked at C speed (an identity scan of the
items, which two states that share their older items pass at once; else the
list's own ``==`` and a scan of the items' types to rule out ``1 == True``),
and only a list that did *not* merely grow is walked item by item in Python.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["added", "removed", "replaced", "appended", "inserted", "deleted"]
Path = tuple[str | int, ...]

#: kinds, in the order the module docstring explains them (for a CLI's legend)
KINDS: tuple[Kind, ...] = ("added", "removed", "replaced", "appended", "inserted", "deleted")

#: types whose ``==`` is exact between two values of the same type
_ATOMS = frozenset({str, int, bool, type(None), bytes})
#: ``==`` across two of these says equal where JSON does not (``1 == 1.0 == True``)
_NUMBERS = frozenset({int, float, bool})
_FLAT = _ATOMS | {float}
_SEQUENCES = frozenset({list, tuple})
_CONTAINERS = _SEQUENCES | {dict}


@dataclass(frozen=True, slots=True)
class Change:
    """One difference at ``path``; see the module docstring for what ``old`` and ``new`` hold per kind."""

    path: Path
    kind: Kind
    old: Any = None
    new: Any = None


def diff(a: Any, b: Any) -> list[Change]:
    """What changed from state ``a`` to state ``b``, in a deterministic order.

    The order: a dict's keys in ``a``'s order (changed or removed), then the
    keys only ``b`` has in ``b``'s order; a change inside a value comes where
    that value's key does; a list's changes by index. Two equal states give
    ``[]``.
    """
    out: list[Change] = []
    try:
        _diff_value((), a, b, out)
    except RecursionError:
        raise ValueError("diff: a value nests deeper than Python's recursion limit "
                         "(does it contain itself?)") from None
    return out


def equal(a: Any, b: Any) -> bool:
    """Whether two values are equal as JSON (see the module docstring): ``diff(a, b) == []``."""
    try:
        return _equal(a, b)
    except RecursionError:
        raise ValueError("equal: a value nests deeper than Python's recursion limit "
                         "(does it contain itself?)") from None


_END = object()


def first_divergence(states_a: Iterable[Any], states_b: Iterable[Any]) -> int | None:
    """The first super-step index at which two runs' states differ, or None if they never do.

    ``states_a`` and ``states_b`` are the states by super-step, the same step
    first in both (the answer is a position in them: the super-step itself
    when both start at step 0), consumed lazily: nothing is read past the
    first divergence. A run that ends while the other goes on diverges where
    it ends (at its length).
    """
    pairs = itertools.zip_longest(states_a, states_b, fillvalue=_END)
    for step, (a, b) in enumerate(pairs):
        if a is _END or b is _END or not equal(a, b):
            return step
    return None


def to_json(changes: Iterable[Change]) -> list[dict[str, Any]]:
    """The changes as JSON-ready data (``json.dumps`` it): a list of
    ``{"path": [...], "kind": ..., "old": ..., "new": ...}``, both values
    always present (``null`` where a kind has none).

    Paths stay lists of keys and indexes, so ``["a.b"]``, ``["a", "b"]``,
    ``["0"]`` and ``[0]`` stay distinct; strings are passed through untouched
    (escaping markup is the job of whatever renders them). A value that is not
    JSON-like raises ``TypeError`` naming its path.
    """
    return [{"path": list(c.path), "kind": c.kind, "old": _jsonable(c.old, c.path),
             "new": _jsonable(c.new, c.path)} for c in changes]


# -- equality ------------------------------------------------------------------


def _fields(value: Any) -> Mapping[Any, Any] | None:
    """``value`` as a mapping of its fields if it is a dict, a dataclass or a pydantic model, else None.

    Shallow on purpose (``dataclasses.asdict`` and ``model_dump`` copy every
    nested value, which costs time and loses the identity of the items two
    states share).
    """
    if isinstance(value, dict):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    pydantic = sys.modules.get("pydantic")  # never imported here: a model exists only if pydantic is loaded
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return dict(value)  # its fields and extras, values as they are
    if isinstance(value, Mapping):
        return value
    return None


def _equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    ta, tb = type(a), type(b)
    if ta is tb and ta in _ATOMS:
        return bool(a == b)
    if ta is float and tb is float:
        return bool(a == b or (a != a and b != b))  # NaN is NaN
    if ta in _SEQUENCES and tb in _SEQUENCES:
        return len(a) == len(b) and _same_items(a, b)
    fa, fb = _fields(a), _fields(b)
    if fa is not None and fb is not None:
        return _same_mapping(fa, fb)
    if fa is not None or fb is not None or ta in _SEQUENCES or tb in _SEQUENCES:
        return False
    return ta is tb and bool(a == b)


def _exact(level: list[Any]) -> bool:
    """Whether ``==``, which found the containers in ``level`` (two of them) equal, is exact here.

    It is unless a number (int, float, bool) may equal one of another type
    (``1 == 1.0 == True``): the values inside are gathered level by level, at
    C speed (``chain``, ``map``, ``set``), and their types checked. False also
    means "not proven" (a level mixing dicts and lists, other types, or two
    kinds of numbers anywhere): the caller then compares item by item.
    """
    numbers: set[type] = set()
    containers = set(map(type, level))
    while True:
        if containers <= {dict}:
            children = list(itertools.chain.from_iterable(map(dict.values, level)))
        elif containers <= _SEQUENCES:
            children = list(itertools.chain.from_iterable(level))
        else:
            return False
        types = set(map(type, children))
        numbers |= types & _NUMBERS
        if len(numbers) > 1:
            return False
        containers = types - _FLAT
        if not containers:
            return True
        # the containers of this level are the next one (flat values beside them dropped, at C speed)
        is_container = map(_CONTAINERS.__contains__, map(type, children))
        level = children if types == containers else list(itertools.compress(children, is_container))


def _same_items(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Two sequences of the same length, item by item equal."""
    return _common_prefix(a, b) == len(a)


def _same_mapping(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> bool:
    if len(a) != len(b) or a.keys() != b.keys():
        return False
    if type(a) is dict and type(b) is dict and a == b and _exact([a, b]):
        return True
    return all(_equal(a[k], b[k]) for k in a)


def _as_list(items: Sequence[Any]) -> list[Any]:
    return items if isinstance(items, list) else list(items)


# -- the diff ------------------------------------------------------------------


def _diff_value(path: Path, a: Any, b: Any, out: list[Change]) -> None:
    if a is b:
        return
    if type(a) in _SEQUENCES and type(b) in _SEQUENCES:
        _diff_sequence(path, a, b, out)
        return
    fa, fb = _fields(a), _fields(b)
    if fa is not None and fb is not None:
        _diff_mapping(path, fa, fb, out)
    elif not _equal(a, b):
        out.append(Change(path, "replaced", a, b))


def _diff_mapping(path: Path, a: Mapping[Any, Any], b: Mapping[Any, Any], out: list[Change]) -> None:
    for key, old in a.items():
        if key in b:
            _diff_value((*path, _key(path, key)), old, b[key], out)
        else:
            out.append(Change((*path, _key(path, key)), "removed", old, None))
    for key, new in b.items():
        if key not in a:
            out.append(Change((*path, _key(path, key)), "added", None, new))


def _key(path: Path, key: Any) -> str | int:
    if isinstance(key, str | int):
        return key
    raise TypeError(f"diff: the key {key!r} at {_show(path)} is a {type(key).__name__}, not a str or an int")


def _diff_sequence(path: Path, a: Sequence[Any], b: Sequence[Any], out: list[Change]) -> None:
    m, n = len(a), len(b)
    start = _common_prefix(a, b)
    if start == m:
        if n > m:
            out.append(Change(path, "appended", None, list(b[m:])))
        return
    shortest = min(m, n)
    end = _common_prefix(a[m - shortest:][::-1], b[n - shortest:][::-1], shortest - start)
    old, new = list(a[start:m - end]), list(b[start:n - end])
    if not old:
        out.append(Change((*path, start), "inserted", None, new))
    elif not new:
        out.append(Change((*path, start), "deleted", old, None))
    elif len(old) == len(new):
        for i, (x, y) in enumerate(zip(old, new, strict=True)):
            _diff_value((*path, start + i), x, y, out)
    else:
        out.append(Change(path, "replaced", a, b))


def _common_prefix(a: Sequence[Any], b: Sequence[Any], limit: int | None = None) -> int:
    """How many leading items (at most ``limit``) ``a`` and ``b`` have equal.

    Each stretch is found at C speed: the items that are the very same
    objects (what two states of one run share), then the items ``==`` finds
    equal, proven exact by :func:`_exact`. Python compares single items only
    where ``==`` says unequal (a dataclass may still equal its dict) or could
    not be proven exact.
    """
    limit = min(len(a), len(b)) if limit is None else limit
    i = next(itertools.compress(itertools.count(), map(operator.is_not, a[:limit], b[:limit])), limit)
    while i < limit:
        rest_a, rest_b = a[i:limit], b[i:limit]
        j = i + next(itertools.compress(itertools.count(), map(operator.ne, rest_a, rest_b)), limit - i)
        if j > i and not _exact([rest_a[:j - i], rest_b[:j - i]]):
            k = next(itertools.compress(itertools.count(i), map(_unequal, rest_a[:j - i], rest_b[:j - i])), j)
            if k < j:
                return k
        if j == limit or not _equal(a[j], b[j]):
            return j
        i = j + 1
    return i


def _unequal(a: Any, b: Any) -> bool:
    return not _equal(a, b)


# -- JSON --------------------------------------------------------------------


def _jsonable(value: Any, path: Path) -> Any:
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return value
    if kind in _SEQUENCES:
        return [_jsonable(item, (*path, i)) for i, item in enumerate(value)]
    fields = _fields(value)
    if fields is not None:
        return {_json_key(path, k): _jsonable(v, (*path, k)) for k, v in fields.items()}
    for plain in (bool, str, int, float):  # a str or int enum, a subclass: its plain value
        if isinstance(value, plain):
            return plain(value)
    raise TypeError(f"to_json: the value at {_show(path)} is a {kind.__name__}, not a JSON value")


def _json_key(path: Path, key: Any) -> str:
    if isinstance(key, str):
        return str(key)
    if isinstance(key, int):
        return str(int(key))  # what json.dumps would write for it
    raise TypeError(f"to_json: the key {key!r} at {_show(path)} is a {type(key).__name__}, "
                    "not a str or an int")


def _show(path: Path) -> str:
    """A path for an error message: the state's root, or its keys and indexes as a list."""
    return "the top" if not path else repr(list(path))
