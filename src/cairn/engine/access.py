"""Per-tool authorization: which tenants and workflows may call a tool.

A tool (local, ``app.tool(..., access=ToolAccess(...))``, or from an MCP server,
``MCPServer(access={...})``) may name the tenants and the workflows allowed
to call it. A call from anyone else is refused before anything is sent or
run, and the refusal is recorded: a failed ``tool`` entry at the call's
position, with ``ToolRefused`` and the reason, so the journal shows who
tried what, and a replay raises the same refusal at the same place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from cairn.engine.execution import Execution
from cairn.errors import CairnError, InvalidArgument
from cairn.retry import TerminalError

__all__ = ["ToolAccess", "ToolRefused", "refuse"]


class ToolRefused(TerminalError, CairnError):
    """A tool call the app does not allow (or, for MCP, a tool the run's
    list does not have): never sent, never retried."""


@dataclass(frozen=True)
class ToolAccess:
    """Who may call a tool: ``tenants`` and ``workflows`` (``None``: any)."""

    tenants: frozenset[str] | None = None
    workflows: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for what, names in (("tenants", self.tenants), ("workflows", self.workflows)):
            if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
                raise InvalidArgument(f"ToolAccess({what}=...) is a set of names, not {names!r}")
            if names is not None and not isinstance(names, frozenset):
                object.__setattr__(self, what, frozenset(names))

    def refusal(self, tenant: str, workflow: str) -> str | None:
        """Why ``tenant``'s ``workflow`` may not call the tool (``None``: it may)."""
        if self.tenants is not None and tenant not in self.tenants:
            return f"tenant {tenant!r} may not call it"
        if self.workflows is not None and workflow not in self.workflows:
            return f"workflow {workflow!r} may not call it"
        return None


def refuse(ex: Execution, name: str, why: str) -> NoReturn:
    """Record the refusal of a call of tool ``name`` at the next position and
    raise it (on replay: the recorded refusal)."""
    call = ex.begin("tool", name)
    if call.recorded is not None:
        ex.replay(call, Any)  # raises the recorded failure
    ex.fail_call(call, ToolRefused(why), retryable=False, retry_delay=None)
