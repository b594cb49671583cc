"""Per-tool authorization: which tenants, token roles and workflows may call a tool.

A tool (local, ``app.tool(..., access=ToolAccess(...))``, or from an MCP server,
``MCPServer(access={...})``) may name the tenants and the workflows allowed
to call it, and the least token role its run must have been started with
(``role="admin"``: admin or installation; the order is the API's, viewer <
operator < admin < installation). The role is the one the run recorded when
it was started (``engine.startedwith``), not the worker's: a run resumed
elsewhere has the rights it started with. A run started without a token
(the app's own code, unless it says ``role=``; a schedule) has no role and
is refused any tool that names one.

A call from anyone else is refused before anything is sent or run, and the
refusal is recorded: a failed ``tool`` entry at the call's position, with
``ToolRefused`` and the reason (which names the role and token), so the
journal and ``cairn show`` tell who tried what, and a replay raises the same
refusal at the same place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from cairn.engine.execution import Execution
from cairn.engine.startedwith import rank, started_with
from cairn.errors import CairnError, InvalidArgument
from cairn.retry import TerminalError
from cairn.store.records import STARTED_ROLES

__all__ = ["ToolAccess", "ToolRefused", "refuse"]


class ToolRefused(TerminalError, CairnError):
    """A tool call the app does not allow (or, for MCP, a tool the run's
    list does not have): never sent, never retried."""


@dataclass(frozen=True)
class ToolAccess:
    """Who may call a tool: ``tenants`` and ``workflows`` (``None``: any),
    and ``role``, the least token role the run was started with (``None``:
    any, or none)."""

    tenants: frozenset[str] | None = None
    workflows: frozenset[str] | None = None
    role: str | None = None

    def __post_init__(self) -> None:
        for what, names in (("tenants", self.tenants), ("workflows", self.workflows)):
            if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
                raise InvalidArgument(f"ToolAccess({what}=...) is a set of names, not {names!r}")
            if names is not None and not isinstance(names, frozenset):
                object.__setattr__(self, what, frozenset(names))
        if self.role is not None and self.role not in STARTED_ROLES:
            raise InvalidArgument(f"ToolAccess(role=...) is one of {', '.join(STARTED_ROLES)}, "
                                  f"not {self.role!r}")

    def refusal(self, tenant: str, workflow: str, role: str | None = None,
                token: str | None = None) -> str | None:
        """Why ``tenant``'s ``workflow``, started as ``role`` (with
        ``token``), may not call the tool (``None``: it may)."""
        if self.tenants is not None and tenant not in self.tenants:
            return f"tenant {tenant!r} may not call it"
        if self.workflows is not None and workflow not in self.workflows:
            return f"workflow {workflow!r} may not call it"
        if self.role is not None and rank(role) < rank(self.role):
            who = "a run started without a token role" if role is None else \
                f"a run started as {role}" + (f" (token {token})" if token else "")
            return f"{who} may not call it: it needs {self.role}"
        return None

    def pinned(self) -> dict[str, Any]:
        """The rule as a bundle pins it (``engine.bundles.tool_fingerprint``,
        and the code hash where the workflow's code holds one): changing it is
        a bundle change."""
        return {"tenants": None if self.tenants is None else sorted(self.tenants),
                "workflows": None if self.workflows is None else sorted(self.workflows),
                "role": self.role}

    bundle_pin = pinned

    def refusal_in(self, ex: Execution) -> str | None:
        """``refusal`` for the run ``ex`` executes (its role read only when
        the rule names one)."""
        if self.role is None:
            return self.refusal(ex.run.tenant, ex.run.workflow)
        started = started_with(ex)
        return self.refusal(ex.run.tenant, ex.run.workflow, started.role, started.token)


def refuse(ex: Execution, name: str, why: str) -> NoReturn:
    """Record the refusal of a call of tool ``name`` at the next position and
    raise it (on replay: the recorded refusal)."""
    call = ex.begin("tool", name)
    if call.recorded is not None:
        ex.replay(call, Any)  # raises the recorded failure
    ex.fail_call(call, ToolRefused(why), retryable=False, retry_delay=None)
