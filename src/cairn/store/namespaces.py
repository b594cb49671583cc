"""Long-term memory namespaces as stored text.

A namespace is a tuple of non-empty labels, e.g. ``("users", "u1",
"preferences")``. It is stored as each label followed by U+001F (the unit
separator), so that a namespace *prefix* is a plain string prefix: the
encoding of ``("users",)`` is a prefix of the encoding of ``("users", "u1")``
and never of ``("users2",)``. Queries compare with ``substr`` (never
``LIKE``, whose ``%`` and ``_`` a label may contain). A label that is empty
or contains U+001F would break that property and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from cairn.errors import InvalidArgument

SEPARATOR = "\x1f"


def _check(labels: Sequence[str]) -> None:
    if isinstance(labels, str):
        raise InvalidArgument(f"a namespace is a sequence of labels, not the string {labels!r}")
    for label in labels:
        if not isinstance(label, str) or not label:
            raise InvalidArgument(f"namespace label {label!r} is empty or not a string")
        if SEPARATOR in label:
            raise InvalidArgument(f"namespace label {label!r} contains U+001F (the label separator)")


def encode_namespace(labels: Sequence[str]) -> str:
    """The stored text of namespace ``labels`` (at least one label)."""
    _check(labels)
    if not labels:
        raise InvalidArgument("a namespace needs at least one label")
    return "".join(label + SEPARATOR for label in labels)


def encode_prefix(labels: Sequence[str]) -> str:
    """The stored prefix of every namespace under ``labels`` ("" for none: everything)."""
    _check(labels)
    return "".join(label + SEPARATOR for label in labels)


def decode_namespace(text: str) -> tuple[str, ...]:
    """The labels of a stored namespace (``InvalidArgument`` if it is not one)."""
    if not text or not text.endswith(SEPARATOR):
        raise InvalidArgument(f"{text!r} is not a stored namespace")
    labels = tuple(text[:-1].split(SEPARATOR))
    if any(not label for label in labels):
        raise InvalidArgument(f"{text!r} is not a stored namespace (an empty label)")
    return labels


__all__ = ["SEPARATOR", "decode_namespace", "encode_namespace", "encode_prefix"]
