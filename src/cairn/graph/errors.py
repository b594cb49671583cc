"""What a graph refuses: at compile time (``InvalidGraph``, ``app.graph``
raises it and nothing is registered) and while it runs (``GraphError``, the
node's or the router's failure, which fails the run without a checkpoint)."""

from __future__ import annotations

from cairn.errors import CairnError, InvalidArgument
from cairn.retry import TerminalError


class InvalidGraph(InvalidArgument):
    """A graph that cannot run: a missing node, a field without a usable
    reducer, a loop with no way out to ``END``. Raised by ``Graph`` methods
    and by ``app.graph``, before anything is stored."""


class GraphError(CairnError, TerminalError):
    """A graph run cannot go on: an update that does not fit the state, a
    reducer that raised, a router naming no node, the super-step limit.
    Terminal: retrying the node would meet the same state and code."""


#: how much of a user's text (an exception's message, a value a router returned) an error quotes
QUOTED = 300


def cut(text: str, limit: int = QUOTED) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out: a
    run's error is one readable line, never a copy of a 10 MB value."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"
