"""SQL literals rendered on the client for the LangGraph writes that PostgreSQL
gets as one simple-query message with their COMMIT (``PostgresStore._lg_operate``).

A simple query carries no parameters: its values are literals in its text.
psycopg's ``ClientCursor.mogrify`` renders them, at ~230-280 µs of client CPU a
super-step (~6.5 statements; 15-20 % of the saver's CPU, issue 24,
2026-12-07): a Transformer per call, a dumper looked up per value, and arrays
quoted in Python with a regular expression per element. ``bind`` renders the
few types those statements pass, the same values with the same types:

* ``None`` -> ``NULL``; ``bool`` -> ``true`` / ``false``;
* ``int`` within bigint -> its digits, a negative one after a space (as psycopg:
  ``1-%(x)s`` must not become the comment ``1--1``), no cast;
* ``str`` -> ``'...'``, each ``'`` doubled, no cast (an untyped literal, as
  psycopg's): a standard string, so only valid where ``standard_conforming_strings``
  is ``on`` (there a backslash is an ordinary character). The caller checks it;
* ``bytes``, ``bytearray``, a contiguous ``memoryview`` -> ``'\\x<hex>'::bytea``;
* a list of ``str`` (or of ``None`` alone, or empty) -> ``'{...}'``, uncast; of
  ``int`` -> ``'{...}'::int2[]`` / ``int4[]`` / ``int8[]``, the narrowest type
  holding every element (psycopg's choice); of ``bytes`` -> ``'{...}'::bytea[]``.
  Every element but ``NULL`` is double-quoted, its ``\\`` and ``"`` escaped by a
  backslash (the array parser's rules), then the array text quoted as a string.

Anything else raises ``Unrenderable``, and the caller binds the statement with
psycopg instead: other types, an int beyond bigint, a list mixing types,
nested lists, text holding NUL (psycopg refuses it: ``DataError``), a name the
parameters lack (psycopg: ``ProgrammingError``), a query with any ``%`` but
``%(name)s`` and ``%%`` (``%%`` is ``%``, as psycopg reads it). So every error
is psycopg's own. This module never imports psycopg (only ``store/postgres.py``
talks to PostgreSQL: tests/store/test_pg_no_pipeline.py).

The text is returned as ``str``; psycopg encodes it to the connection's
encoding when it sends it, which the caller checks is UTF8 (a string that
cannot be encoded, a lone surrogate, fails there with psycopg's
``UnicodeEncodeError``, as mogrify's would)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["Unrenderable", "bind", "literal"]


class Unrenderable(Exception):
    """``bind`` does not render this query or value: bind it with psycopg."""


#: psycopg's placeholder syntax (psycopg/_queries.py, ``_re_placeholder``): ``%``, then a
#: name in parentheses and one character, or any one character (not a newline)
_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\)(.)|(.))")

_BIGINT_MIN = -(2**63)
_BIGINT_MAX = 2**63 - 1


@functools.lru_cache(maxsize=256)
def _parsed(query: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``query`` as its text between placeholders (``%%`` made ``%``) and the
    placeholders' names: n names, n + 1 texts."""
    texts: list[str] = []
    names: list[str] = []
    pending: list[str] = []  # the current text, in pieces
    at = 0
    for match in _PLACEHOLDER.finditer(query):
        before = query[at:match.start()]
        if "%" in before:  # a "%" the pattern skipped (before a newline): psycopg decides
            raise Unrenderable(query)
        pending.append(before)
        at = match.end()
        name, kind, other = match.groups()
        if other == "%":
            pending.append("%")
        elif name is not None and kind == "s":
            texts.append("".join(pending))
            pending = []
            names.append(name)
        else:  # %s, %b, %(name)b, %(name)t, an incomplete placeholder: psycopg's to bind or refuse
            raise Unrenderable(query)
    rest = query[at:]
    if "%" in rest:  # a "%" at the very end
        raise Unrenderable(query)
    pending.append(rest)
    texts.append("".join(pending))
    return tuple(texts), tuple(names)


def bind(query: str, params: Mapping[str, Any]) -> str:
    """``query`` with each ``%(name)s`` replaced by the literal of
    ``params[name]`` (``literal``) and each ``%%`` by ``%``; ``Unrenderable``
    when it cannot (the module doc): then bind it with psycopg."""
    texts, names = _parsed(query)
    out = [texts[0]]
    for name, text in zip(names, texts[1:], strict=True):
        try:
            value = params[name]
        except KeyError:
            raise Unrenderable(name) from None
        out.append(literal(value))
        out.append(text)
    return "".join(out)


def _text(value: str) -> str:
    if "\x00" in value:
        raise Unrenderable("NUL in text")
    return "'" + value.replace("'", "''") + "'"


def _bytea(value: bytes | bytearray) -> str:
    return "'\\x" + value.hex() + "'::bytea"


def literal(value: Any) -> str:
    """The SQL literal of ``value`` (the module doc), or ``Unrenderable``."""
    kind = type(value)
    if value is None:
        return "NULL"
    if kind is str:
        return _text(value)
    if kind is bytes or kind is bytearray:
        return _bytea(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        if not _BIGINT_MIN <= value <= _BIGINT_MAX:
            raise Unrenderable("int beyond bigint")
        return str(value) if value >= 0 else " " + str(value)
    if kind is list:
        return _array(value)
    if kind is memoryview and value.c_contiguous:
        return _bytea(value.tobytes())
    raise Unrenderable(kind.__name__)


def _quoted(element: str) -> str:
    """An element of an array's text, double-quoted: ``NULL``, ``""``, braces,
    commas and spaces are then its own characters, and only ``\\`` and ``"``
    need escaping."""
    return '"' + element.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array(values: list[Any]) -> str:
    kinds = {type(v) for v in values}
    kinds.discard(type(None))
    if not kinds or kinds == {str}:  # uncast, as psycopg's (an empty list, NULLs alone: text too)
        # quoted as a string whole: a NUL in an element is refused there
        return _text("{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}")
    if kinds == {int}:
        present = [v for v in values if v is not None]
        low, high = min(present), max(present)
        if low < _BIGINT_MIN or high > _BIGINT_MAX:
            raise Unrenderable("int beyond bigint")
        # psycopg's type: the narrowest holding the largest magnitude (types/array.py)
        widest = high if low >= 0 else max(high, -low - 1)
        cast = "int2" if widest < 2**15 else "int4" if widest < 2**31 else "int8"
        text = ",".join("NULL" if v is None else str(v) for v in values)
        return "'{" + text + "}'::" + cast + "[]"
    if kinds <= {bytes, bytearray}:
        text = ",".join("NULL" if v is None else '"\\\\x' + v.hex() + '"' for v in values)
        return "'{" + text + "}'::bytea[]"
    raise Unrenderable("list of " + ", ".join(sorted(k.__name__ for k in kinds)))
