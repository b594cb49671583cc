"""Retention of the memory tiers: how long memory lives, and whether reading
it keeps it alive.

Configured once per app (``App(memory=MemoryPolicy(...))``) rather than per
write, so that every writer of a namespace agrees on it. The rule for a
namespace is that of its longest configured prefix; threads have one rule;
run memory lives exactly as long as its run (no TTL: pruning the run deletes
it). A ``put(..., ttl=...)`` may still override the TTL of one item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cairn.errors import InvalidArgument
from cairn.memory.embedders import Embedder


@dataclass(frozen=True, slots=True)
class Retention:
    """``ttl``: seconds a memory lives after it was written (``None``:
    forever). ``refresh_on_read``: a read renews it (``ttl`` from the read)."""

    ttl: float | None = None
    refresh_on_read: bool = False

    def __post_init__(self) -> None:
        if self.ttl is not None and not self.ttl > 0:
            raise InvalidArgument(f"a memory TTL must be a positive number of seconds, not {self.ttl!r}")


FOREVER = Retention()


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """Retention by namespace prefix and for threads, and the embedder that
    semantic search uses (``cairn.memory.embedders``); with an embedder,
    ``cairn worker`` also runs the embedding worker (``memory.indexer``)."""

    namespaces: Mapping[tuple[str, ...], Retention] = field(default_factory=dict)
    threads: Retention = FOREVER
    embedder: Embedder | None = None
    #: seconds a long-term item goes unread and unwritten before its vector
    #: is quantized to the cold tier and its value is compressed out of the
    #: hot row (``memory.tiering``; ``None``: everything stays hot)
    cold_after: float | None = None

    def __post_init__(self) -> None:
        if self.cold_after is not None and not self.cold_after > 0:
            raise InvalidArgument(f"cold_after must be a positive number of seconds, not {self.cold_after!r}")

    def for_namespace(self, namespace: Sequence[str]) -> Retention:
        """The rule of the longest configured prefix of ``namespace``."""
        labels = tuple(namespace)
        for n in range(len(labels), -1, -1):
            rule = self.namespaces.get(labels[:n])
            if rule is not None:
                return rule
        return FOREVER


__all__ = ["FOREVER", "MemoryPolicy", "Retention"]
