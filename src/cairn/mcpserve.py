"""``cairn mcp serve``: a tenant's runs, approvals and signals as MCP tools
and resources, so another agent or an IDE can start a run, read its state
and answer an approval.

It speaks MCP over stdio (the client starts it), as one principal: the
bearer token of the HTTP API given at start (``--token`` or
``$CAIRN_TOKEN``), checked once, with the same tenant and role rules as the
HTTP API (``cairn.api.tokens``): reading needs ``viewer``, acting
(starting, approving, rejecting, signalling) needs ``operator``. Every run
id is looked up in the token's tenant only; another tenant's run is "not
found", exactly like an unknown id, and run ids chosen by the client are put
in the tenant's own namespace (``runids.scoped_run_id``), as the HTTP API
does. Actions are recorded with the token's actor (``mcp:<name>#<id>``).

Errors reach the client as MCP tool errors (one line), never as a
traceback.
"""

from __future__ import annotations

from typing import Any

from cairn.api.app import App
from cairn.api.tokens import Principal, Role
from cairn.api.views import approval_json, run_detail, run_json
from cairn.errors import CairnError, MissingExtra, RunNotFound
from cairn.store.records import RunRecord, RunStatus
from cairn.store.runids import id_problem, scoped_run_id

try:
    from mcp.server.fastmcp import FastMCP
    from mcp.server.fastmcp.exceptions import ToolError
except ImportError as exc:
    raise MissingExtra("cairn.mcpserve", "mcp") from exc

__all__ = ["build"]


def build(app: App, principal: Principal) -> FastMCP:
    """The MCP server of ``principal`` (a checked token) over ``app``."""
    server = FastMCP("cairn", instructions=f"Runs of tenant {principal.tenant!r} on Cairn.",
                     log_level="WARNING")
    operator = app.operator.acting_as(f"mcp:{principal.name}#{principal.token_id}")

    def need(role: Role) -> None:
        if not principal.role.allows(role):
            raise ToolError(f"refused: this needs a {role.value} token (this one is {principal.role.value})")

    def run(run_id: str) -> RunRecord:
        if id_problem(run_id) is not None:
            raise ToolError(f"run {run_id!r} not found")
        try:
            record = app.get_run(run_id)
        except RunNotFound:
            record = None
        if record is None or record.tenant != principal.tenant:
            raise ToolError(f"run {run_id!r} not found")
        return record

    def guarded(fn: Any) -> Any:
        """One-line errors: a Cairn error is the tool's error result."""
        import functools

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ToolError:
                raise
            except CairnError as exc:
                raise ToolError(" ".join(str(exc).split())) from None

        return wrapper

    @server.tool(description="List the tenant's runs, newest first (viewer).")
    @guarded
    def list_runs(status: str | None = None, workflow: str | None = None, limit: int = 50) -> dict[str, Any]:
        need(Role.VIEWER)
        if status is not None and status not in {s.value for s in RunStatus}:
            raise ToolError(f"unknown status {status!r}")
        records = app.list_runs(status=status, tenant=principal.tenant, workflow=workflow,
                                limit=max(1, min(limit, 500)))
        return {"runs": [run_json(r) for r in records]}

    @server.tool(description="A run: status, input, result or error, pending approvals (viewer).")
    @guarded
    def get_run(run_id: str) -> dict[str, Any]:
        need(Role.VIEWER)
        return run_detail(operator, run(run_id), journal=False)

    @server.tool(description="Start a run of a workflow with its input as JSON; idempotent on run_id "
                             "(operator).")
    @guarded
    def start_run(workflow: str, input: dict[str, Any] | None = None, run_id: str | None = None,
                  thread_id: str | None = None) -> dict[str, Any]:
        need(Role.OPERATOR)
        chosen = scoped_run_id(principal.tenant, run_id) if run_id is not None else None
        handle = app.start_json(workflow, input or {}, run_id=chosen, thread_id=thread_id,
                                tenant=principal.tenant, started_role=principal.role.value,
                                started_token=principal.token_id)
        record = run(handle.run_id)  # an id taken by another tenant's run: not found, as in the API
        return {"created": handle.created, "run": run_json(record)}

    @server.tool(description="Approval requests of the tenant (of one run if given), pending ones "
                             "unless all=true (viewer).")
    @guarded
    def list_approvals(run_id: str | None = None, all: bool = False) -> dict[str, Any]:
        need(Role.VIEWER)
        if run_id is not None:
            run(run_id)
        views = operator.approvals(tenant=principal.tenant, run_id=run_id, pending=not all)
        return {"approvals": [approval_json(v) for v in views]}

    @server.tool(description="Approve an approval request of a run, as requested (operator).")
    @guarded
    def approve(run_id: str, request_id: str, comment: str | None = None) -> dict[str, Any]:
        need(Role.OPERATOR)
        run(run_id)
        return approval_json(operator.approve(run_id, request_id, comment=comment))

    @server.tool(description="Reject an approval request of a run (operator).")
    @guarded
    def reject(run_id: str, request_id: str, comment: str | None = None) -> dict[str, Any]:
        need(Role.OPERATOR)
        run(run_id)
        return approval_json(operator.reject(run_id, request_id, comment=comment))

    @server.tool(description="Send a signal with JSON data to a run (operator).")
    @guarded
    def signal(run_id: str, name: str, data: Any = None, dedupe: str | None = None) -> dict[str, Any]:
        need(Role.OPERATOR)
        run(run_id)
        sent = operator.signal(run_id, name, data, dedupe=dedupe)
        return {"delivered": sent.created, "run_id": run_id, "name": name}

    @server.resource("cairn://runs/{run_id}", description="A run of the tenant, as get_run shows it.",
                     mime_type="application/json")
    def run_resource(run_id: str) -> dict[str, Any]:
        need(Role.VIEWER)
        try:
            return run_detail(operator, run(run_id), journal=False)
        except CairnError as exc:
            raise ToolError(" ".join(str(exc).split())) from None

    return server
