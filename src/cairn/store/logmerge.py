"""Merging streams that are each in log order and each start at a known
time, opening a stream only once the merge reaches where it starts (issue
26: the audit log's hot runs and archived runs, ``api.auditlog``).

A source is ``(start, open)``: ``start`` is a bound on its items' times in
the merge's direction (no item earlier than it oldest first, none later
newest first) and ``open()`` gives its items in log order. Sources come in
the order of their starts, so once the next item to give is before the next
source's start, no source still closed can hold an item before it: a page
opens the sources its items come from, and at most the next one.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")


class _Later(Generic[K]):
    """A key that sorts first when it is the later one (a min-heap of the newest first)."""

    __slots__ = ("key",)

    def __init__(self, key: K) -> None:
        self.key = key

    def __lt__(self, other: _Later[K]) -> bool:
        return bool(self.key > other.key)  # type: ignore[operator]


def lazy_merge(sources: Iterable[tuple[float, Callable[[], Iterable[T]]]], key: Callable[[T], Any],
               at: Callable[[T], float], *, newest: bool) -> Iterator[T]:
    """The items of ``sources`` in ``key`` order (reversed if ``newest``),
    each source opened only when the next item is not before its start
    (``at``: an item's time, compared with the starts)."""
    pending = iter(sources)
    ahead: list[tuple[Any, int, T, Iterator[T]]] = []  # each opened source's next item
    order = itertools.count()

    def push(item: T, rest: Iterator[T]) -> None:
        heapq.heappush(ahead, (_Later(key(item)) if newest else key(item), next(order), item, rest))

    upcoming = next(pending, None)
    while True:
        while upcoming is not None and (not ahead or _reaches(upcoming[0], at(ahead[0][2]), newest)):
            items = iter(upcoming[1]())
            first = next(items, None)
            if first is not None:
                push(first, items)
            upcoming = next(pending, None)
        if not ahead:
            return
        _, _, item, rest = heapq.heappop(ahead)
        yield item
        following = next(rest, None)
        if following is not None:
            push(following, rest)


def _reaches(start: float, at: float, newest: bool) -> bool:
    """Whether a source starting at ``start`` may hold an item that comes
    before (or ties with) one at time ``at``."""
    return start >= at if newest else start <= at
