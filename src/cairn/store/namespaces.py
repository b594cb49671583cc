"""Long-term memory namespaces as text (the shared design of issue 14).

A namespace is a tuple of non-empty labels, e.g. ``("users", "u1",
"preferences")``. It is stored as TEXT with every label followed by U+001F,
so that "every namespace under this prefix" is a plain string prefix
(``substr(namespace, 1, length(:prefix)) = :prefix``) on both dialects, with
no LIKE and so no wildcard a label could smuggle in. A label may not be
empty (it would make ``("a", "")`` and ``("a",)`` differ only by a
separator) nor contain the separator.
"""

from __future__ import annotations

from collections.abc import Sequence

from cairn.errors import InvalidArgument

SEPARATOR = "\x1f"


def _checked(labels: Sequence[str]) -> Sequence[str]:
    if isinstance(labels, str):
        raise InvalidArgument(f"a namespace is a tuple of labels, not the string {labels!r}")
    for label in labels:
        if not isinstance(label, str) or not label:
            raise InvalidArgument(f"namespace label {label!r} must be a non-empty string")
        if SEPARATOR in label:
            raise InvalidArgument(f"namespace label {label!r} contains U+001F, the separator")
    return labels


def encode_namespace(labels: Sequence[str]) -> str:
    """The stored text of namespace ``labels`` (at least one label)."""
    if not labels:
        raise InvalidArgument("a namespace needs at least one label")
    return "".join(label + SEPARATOR for label in _checked(labels))


def encode_prefix(labels: Sequence[str]) -> str:
    """The stored prefix of every namespace under ``labels`` ("" for none: everything)."""
    return "".join(label + SEPARATOR for label in _checked(labels))


def decode_namespace(text: str) -> tuple[str, ...]:
    """The labels of a stored namespace."""
    if text and not text.endswith(SEPARATOR):
        raise InvalidArgument(f"malformed stored namespace {text!r}")
    return tuple(text.split(SEPARATOR)[:-1]) if text else ()
