"""The dashboard: server-rendered pages over the same handlers as the API.

Every page is a Jinja2 template with autoescaping on for everything, so user
text (inputs, results, errors, names) is shown as text; the pages carry no
inline script (a Content-Security-Policy of ``script-src 'self'`` forbids it,
as a second line of defence) and the small ``static/app.js`` builds live
rows with ``textContent``, never ``innerHTML``. Sign-in stores the token in
an HttpOnly, SameSite=Strict cookie; actions post to the API with the
``X-Cairn-CSRF`` header a cross-site form cannot send; sign-in and sign-out
forms are refused unless the browser says they came from this server
(``_same_origin``).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from cairn.api.tokens import Principal, Role, TokenRefused
from cairn.server import approvals as approval_routes
from cairn.server import graphpage
from cairn.server import queues as queue_routes
from cairn.server import runs as run_routes
from cairn.server.errors import ApiError, as_api_error
from cairn.server.routing import COOKIE, Call, ServerState
from cairn.store.records import RunStatus

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'; "
       "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")

_env = Environment(loader=PackageLoader("cairn.server", "templates"),
                   autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True)


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


_env.filters["when"] = _when
_env.filters["pretty"] = _pretty
_env.filters["urlpart"] = lambda value: quote(str(value), safe="")


def _page(name: str, code: int = 200, **context: Any) -> HTMLResponse:
    html = _env.get_template(name).render(statuses=[s.value for s in RunStatus], **context)
    return HTMLResponse(html, status_code=code, headers={
        "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store"})


def _principal(state: ServerState, request: Request) -> Principal | None:
    token = request.cookies.get(COOKIE)
    if token is None:
        return None
    try:
        return state.app.tokens.check(token)
    except TokenRefused:
        return None


def _call(state: ServerState, request: Request, principal: Principal, query: Any = None,
          path: dict[str, str] | None = None) -> Call[Any]:
    return Call(request, state.app, principal, state.app.operator.acting_as(principal.actor), None, query,
                path or dict(request.path_params))


def routes(state: ServerState) -> list[Route]:
    def page(render: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            principal = await run_in_threadpool(_principal, state, request)
            if principal is None:
                return RedirectResponse("/login?next=" + quote(request.url.path, safe="/"), status_code=303)
            try:
                return await run_in_threadpool(render, request, principal)
            except Exception as exc:
                error = as_api_error(exc)
                return _page("error.html", error.status, principal=principal, error=error)

        return endpoint

    def runs_page(request: Request, principal: Principal) -> Response:
        params = request.query_params
        status = params.get("status") or None
        if status is not None and status not in {s.value for s in RunStatus}:
            raise ApiError(400, "invalid", f"unknown status {status[:40]!r}")
        query = run_routes.ListRuns(status=RunStatus(status) if status else None,
                                    workflow=params.get("workflow") or None, limit=100)
        listed = run_routes.list_runs(_call(state, request, principal, query))
        return _page("runs.html", principal=principal, runs=listed["runs"], status=status or "",
                     workflow=query.workflow or "")

    def run_page(request: Request, principal: Principal) -> Response:
        call = _call(state, request, principal, run_routes.Page(after=0, limit=1000))
        run = run_routes.show_run(_call(state, request, principal, run_routes.ShowRun()))
        history = run_routes.run_history(call)
        models = run_routes.run_model_calls(call)
        ops = run_routes.run_operations(call)
        asked = approval_routes.run_approvals(
            _call(state, request, principal, approval_routes.RunApprovals()))
        graph = graphpage.graph_view(state.app, call.run(call.path["run_id"]), request.query_params) \
            if graphpage.is_graph_run(history["events"]) else None
        return _page("run.html", principal=principal, run=run, graph=graph, history=history["events"],
                     more=history["next_after"], model_calls=models["model_calls"],
                     models_error=models.get("error"), operations=ops["operations"],
                     approvals=asked["approvals"], can_operate=principal.role.allows(Role.OPERATOR))

    def approvals_page(request: Request, principal: Principal) -> Response:
        listed = approval_routes.inbox(_call(state, request, principal, approval_routes.Inbox()))
        return _page("approvals.html", principal=principal, approvals=listed["approvals"],
                     can_operate=principal.role.allows(Role.OPERATOR))

    def attention_page(request: Request, principal: Principal) -> Response:
        query = run_routes.ListRuns(status=RunStatus.NEEDS_ATTENTION, limit=100)
        items = []
        for run in run_routes.list_runs(_call(state, request, principal, query))["runs"]:
            ops = run_routes.run_operations(_call(state, request, principal, path={"run_id": run["run_id"]}))
            uncertain = set(ops["needs_resolution"])
            items.append({"run": run, "operations": [op for op in ops["operations"]
                                                     if op["position"] in uncertain]})
        return _page("attention.html", principal=principal, items=items,
                     can_operate=principal.role.allows(Role.OPERATOR))

    def queues_page(request: Request, principal: Principal) -> Response:
        listed = queue_routes.list_queues(_call(state, request, principal))
        return _page("queues.html", principal=principal, queues=listed["queues"])

    async def login_form(request: Request) -> Response:
        # signed in already: a sign-in link (/login#token=...) is not followed by itself, or any
        # site could link a user into another tenant's session (login CSRF by a link)
        current = await run_in_threadpool(_principal, state, request)
        return _page("login.html", principal=None, next=_next(request), error=None, current=current)

    async def login(request: Request) -> Response:
        if not _same_origin(request):
            return _cross_site()
        # a urlencoded form of two fields: parsed here, without a multipart parser
        raw = await request.body()
        form = parse_qs(raw[:8192].decode("utf-8", "replace"), max_num_fields=10)
        token = (form.get("token") or [""])[0].strip()
        target = _next(request, (form.get("next") or ["/"])[0])
        try:
            await run_in_threadpool(state.app.tokens.check, token)
        except TokenRefused:
            return _page("login.html", 401, principal=None, next=target, error="invalid or revoked token")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/")
        return response

    async def logout(request: Request) -> Response:
        if not _same_origin(request):
            return _cross_site()
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    return [
        Route("/", page(runs_page), methods=["GET"]),
        Route("/runs/{run_id:path}", page(run_page), methods=["GET"]),  # any run id, '/' included
        Route("/queues", page(queues_page), methods=["GET"]),
        Route("/approvals", page(approvals_page), methods=["GET"]),
        Route("/attention", page(attention_page), methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
    ]


def _same_origin(request: Request) -> bool:
    """Whether a sign-in or sign-out form was posted from this server's own
    pages. Neither can demand the ``X-Cairn-CSRF`` header (the form has no
    script), and SameSite does not help: login CSRF needs no cookie, a
    cross-site form just posts its own token and the answer's cookie replaces
    the user's session with another tenant's. A browser says where a form
    came from: ``Sec-Fetch-Site`` (``same-origin``; ``none`` for a user's
    own navigation), else ``Origin``, which must be this server's. A client
    sending neither is no browser and carries no one else's session."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"{request.url.scheme}://{host}", f"http://{host}", f"https://{host}")


def _cross_site() -> Response:
    return _page("error.html", 403, principal=None, error=ApiError(
        403, "forbidden", "this form was posted from another site; sign in from this server's own page"))


def _next(request: Request, given: str | None = None) -> str:
    """Where to go after signing in: a path on this server only (never another site)."""
    target = given if given is not None else request.query_params.get("next", "/")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
