"""``cairn mcp serve``: a tenant's runs, approvals and signals as MCP tools
and resources, so another agent or an IDE can start a run, read its state
and answer an approval.

It speaks MCP over stdio (the client starts it), as one principal: the
bearer token of the HTTP API given at start (``--token`` or
``$CAIRN_TOKEN``), checked once; or over streamable HTTP (``http_app``,
``cairn mcp serve --http HOST:PORT``), where every request presents its own
token (``Authorization: Bearer ...``), checked before the SDK sees the
request (401 otherwise) and again for each tool call, whose rights are that
request's token's: a session id is no credential, so a client that learns
another's session id gains nothing. Either way the tenant and role rules
are the HTTP API's (``cairn.api.tokens``): reading needs ``viewer``, acting
(starting, approving, rejecting, signalling) needs ``operator``, and a run
started here records the token's role and id (``engine.startedwith``). Every run
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
from cairn.api.operator import Operator
from cairn.api.tokens import Principal, Role, TokenRefused
from cairn.api.views import approval_json, run_detail, run_json
from cairn.errors import CairnError, MissingExtra, RunNotFound
from cairn.store.records import RunRecord, RunStatus
from cairn.store.runids import id_problem, scoped_run_id

try:
    import anyio
    from mcp.server.fastmcp import FastMCP
    from mcp.server.fastmcp.exceptions import ToolError
except ImportError as exc:
    raise MissingExtra("cairn.mcpserve", "mcp") from exc

__all__ = ["build", "http_app"]


def build(app: App, principal: Principal | None = None, **settings: Any) -> FastMCP:
    """The MCP server over ``app``: of ``principal`` (a checked token: stdio),
    or, without one, of each request's own token (``http_app``)."""
    about = "the token's tenant" if principal is None else f"tenant {principal.tenant!r}"
    server = FastMCP("cairn", instructions=f"Runs of {about} on Cairn.", log_level="WARNING", **settings)

    def caller() -> Principal:
        """Who makes this call: the stdio principal, or the token checked
        for this HTTP request by ``_Authenticated``."""
        if principal is not None:
            return principal
        request = server.get_context().request_context.request
        found = getattr(getattr(request, "state", None), "cairn_principal", None)
        if not isinstance(found, Principal):  # never served without the middleware: refuse, do not guess
            raise ToolError("unauthorized: a bearer token is required")
        return found

    def acting(who: Principal) -> Operator:
        return app.operator.acting_as(f"mcp:{who.name}#{who.token_id}")

    def need(role: Role) -> Principal:
        who = caller()
        if not who.role.allows(role):
            raise ToolError(f"refused: this needs a {role.value} token (this one is {who.role.value})")
        return who

    def run(run_id: str, who: Principal) -> RunRecord:
        if id_problem(run_id) is not None:
            raise ToolError(f"run {run_id!r} not found")
        try:
            record = app.get_run(run_id)
        except RunNotFound:
            record = None
        if record is None or record.tenant != who.tenant:
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
        who = need(Role.VIEWER)
        if status is not None and status not in {s.value for s in RunStatus}:
            raise ToolError(f"unknown status {status!r}")
        records = app.list_runs(status=status, tenant=who.tenant, workflow=workflow,
                                limit=max(1, min(limit, 500)))
        return {"runs": [run_json(r) for r in records]}

    @server.tool(description="A run: status, input, result or error, pending approvals (viewer).")
    @guarded
    def get_run(run_id: str) -> dict[str, Any]:
        who = need(Role.VIEWER)
        return run_detail(acting(who), run(run_id, who), journal=False)

    @server.tool(description="Start a run of a workflow with its input as JSON; idempotent on run_id "
                             "(operator).")
    @guarded
    def start_run(workflow: str, input: dict[str, Any] | None = None, run_id: str | None = None,
                  thread_id: str | None = None) -> dict[str, Any]:
        who = need(Role.OPERATOR)
        chosen = scoped_run_id(who.tenant, run_id) if run_id is not None else None
        handle = app.start_json(workflow, input or {}, run_id=chosen, thread_id=thread_id,
                                tenant=who.tenant, started_role=who.role.value, started_token=who.token_id)
        record = run(handle.run_id, who)  # an id taken by another tenant's run: not found, as in the API
        return {"created": handle.created, "run": run_json(record)}

    @server.tool(description="Approval requests of the tenant (of one run if given), pending ones "
                             "unless all=true (viewer).")
    @guarded
    def list_approvals(run_id: str | None = None, all: bool = False) -> dict[str, Any]:
        who = need(Role.VIEWER)
        if run_id is not None:
            run(run_id, who)
        views = acting(who).approvals(tenant=who.tenant, run_id=run_id, pending=not all)
        return {"approvals": [approval_json(v) for v in views]}

    @server.tool(description="Approve an approval request of a run, as requested (operator).")
    @guarded
    def approve(run_id: str, request_id: str, comment: str | None = None) -> dict[str, Any]:
        who = need(Role.OPERATOR)
        run(run_id, who)
        return approval_json(acting(who).approve(run_id, request_id, comment=comment))

    @server.tool(description="Reject an approval request of a run (operator).")
    @guarded
    def reject(run_id: str, request_id: str, comment: str | None = None) -> dict[str, Any]:
        who = need(Role.OPERATOR)
        run(run_id, who)
        return approval_json(acting(who).reject(run_id, request_id, comment=comment))

    @server.tool(description="Send a signal with JSON data to a run (operator).")
    @guarded
    def signal(run_id: str, name: str, data: Any = None, dedupe: str | None = None) -> dict[str, Any]:
        who = need(Role.OPERATOR)
        run(run_id, who)
        sent = acting(who).signal(run_id, name, data, dedupe=dedupe)
        return {"delivered": sent.created, "run_id": run_id, "name": name}

    @server.resource("cairn://runs/{run_id}", description="A run of the tenant, as get_run shows it.",
                     mime_type="application/json")
    def run_resource(run_id: str) -> dict[str, Any]:
        who = need(Role.VIEWER)
        try:
            return run_detail(acting(who), run(run_id, who), journal=False)
        except CairnError as exc:
            raise ToolError(" ".join(str(exc).split())) from None

    return server


def http_app(app: App, host: str = "127.0.0.1", port: int = 8765, path: str = "/mcp") -> Any:
    """The streamable HTTP app of ``cairn mcp serve --http``: the SDK's,
    behind ``_Authenticated`` (each request's bearer token, as the HTTP API
    checks it). ``host`` and ``port`` are where it listens (the SDK's guard
    against DNS rebinding allows only that host's name in ``Host``)."""
    server = build(app, None, host=host, port=port, streamable_http_path=path)
    return _Authenticated(server.streamable_http_app(), app)


class _Authenticated:
    """ASGI middleware: an HTTP request without a live bearer token of
    ``app`` is answered 401 before the SDK reads it; a request with one
    carries its ``Principal`` (``request.state.cairn_principal``) to the
    tool that serves it. The lifespan passes through (the SDK's session
    manager runs in it)."""

    def __init__(self, inner: Any, app: App) -> None:
        self.inner = inner
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        principal = None
        if scheme.lower() == "bearer" and token.strip():
            try:
                principal = await anyio.to_thread.run_sync(self.app.tokens.check, token.strip())
            except TokenRefused:
                principal = None
        if principal is None:
            await _unauthorized(send)
            return
        scope.setdefault("state", {})["cairn_principal"] = principal
        await self.inner(scope, receive, send)


async def _unauthorized(send: Any) -> None:
    body = (b'{"error": "unauthorized", "message": '
            b'"a live bearer token is required (Authorization: Bearer <token>)"}')
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
