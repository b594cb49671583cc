"""Memory tiers (issue 14): run, thread and long-term memory, and what
semantic search needs (``embedders``; ``indexer``: the embedding worker).

A layer directly below the engine: the engine builds ``Memory`` objects for
workflows (``ctx.memory``) and step or tool bodies (``op.memory``), the
operator for introspection. See ``api`` for the API and ``policy`` for
retention; the storage is ``store.memsql``.
"""

from cairn.memory.api import Hit, Item, Memory, Message, SearchResult, Thread
from cairn.memory.policy import MemoryPolicy, Retention

__all__ = ["Hit", "Item", "Memory", "MemoryPolicy", "Message", "Retention", "SearchResult", "Thread"]
