"""The route table: every endpoint once, with the least role it needs.

An endpoint is declared with ``Endpoint`` in the router module of its
resource (``runs.py``, ``queues.py``, ``tokens.py``, ``events.py``; signals
and approvals add modules of their own): method, path, handler, role,
request body and query types. The server builds its Starlette routes, the
OpenAPI document and the tests' authorization matrix from the same table,
so a new endpoint can be neither unauthenticated nor undocumented.

A handler is a plain function of a ``Call`` (the request, who makes it, the
operator acting as them, the parsed body and query) returning JSON-able data
or a response; it runs in a worker thread, since the store is synchronous.
A handler that waits (a long poll) is a coroutine function instead: it runs
on the event loop and takes a thread only for each look at the store, so
waiting clients cannot use up the server's threads.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeVar, get_args
from urllib.parse import unquote_to_bytes

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import Scope

from cairn.api.app import App
from cairn.api.operator import Operator
from cairn.api.tokens import Principal, Role, TokenRefused
from cairn.errors import RunNotFound
from cairn.server.errors import ApiError, response_for
from cairn.store.records import RunRecord
from cairn.store.runids import ID_PATTERN, MAX_ID_LENGTH, id_problem

B = TypeVar("B")

#: the cookie the dashboard's login form sets (HttpOnly, SameSite=Strict)
COOKIE = "cairn_token"
#: the largest request body accepted
MAX_BODY = 1 << 20


class NoBody(msgspec.Struct):
    """An endpoint that takes no body."""


class NoQuery(msgspec.Struct):
    """An endpoint that takes no query parameters."""


@dataclass
class Call(Generic[B]):
    """One request, authenticated: what a handler gets."""

    request: Request
    app: App
    principal: Principal
    operator: Operator
    body: Any
    query: Any
    path: dict[str, str]

    def run(self, run_id: str) -> RunRecord:
        """The run, if it is of the caller's tenant. Another tenant's run is
        ``RunNotFound`` with the message an unknown id gets: a caller cannot
        tell the two apart."""
        return tenant_run(self.app, self.principal, run_id)


#: an id or name in a request (a run id, a thread id, a queue, a signal's
#: name): the rule every run is created with (``store.runids.check_id``)
Ident = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]


def tenant_run(app: App, principal: Principal, run_id: str) -> RunRecord:
    """``run_id``'s run if it is of ``principal``'s tenant, else
    ``RunNotFound`` (an id no run could have, one ``runids.check_id``
    refuses, is unknown too: it never reaches the database)."""
    if id_problem(run_id) is not None:
        raise RunNotFound(run_id)
    record = app.get_run(run_id)
    if record.tenant != principal.tenant:
        raise RunNotFound(run_id)
    return record


Handler = Callable[[Call[Any]], Any]  # or returning an awaitable (see the module doc)
Streamer = Callable[[Request, "ServerState", Principal], Awaitable[Response]]


@dataclass(frozen=True)
class Endpoint:
    """One route of the API."""

    method: str
    path: str
    role: Role
    summary: str
    handler: Handler | None = None
    #: an async handler that answers a stream (Server-Sent Events)
    stream: Streamer | None = None
    body: type[Any] = NoBody
    query: type[Any] = NoQuery
    #: the status of a success
    status: int = 200
    tag: str = "runs"
    #: a short description of the success response, for the OpenAPI document
    returns: str = "OK"
    #: the media type of a success ("text/event-stream" for streams)
    media: str = "application/json"
    #: it reads an ``Idempotency-Key`` header (documented as such)
    idempotent: bool = False
    #: the shape of a success's body (a msgspec struct), published as its schema; the
    #: fuzz test holds the handler to it (``None``: documented as any object)
    response: type[Any] | None = None

    @property
    def parameters(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)


@dataclass
class ServerState:
    """What every request of one server shares."""

    app: App
    #: seconds between heartbeat comments on an idle event stream
    heartbeat: float = 15.0
    #: how long a change may take to commit after it was stamped (the tenant stream waits that long)
    settle: float = 0.0
    #: the longest wait between two looks at the store when no notification comes
    max_poll: float = 0.5
    #: event streams one token may hold open at once (429 beyond)
    max_streams: int = 32
    extra: dict[str, Any] = field(default_factory=dict)


def bearer(request: Request) -> str | None:
    """The presented token: ``Authorization: Bearer X``, else the dashboard's cookie."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise ApiError(401, "unauthorized", "the Authorization header must be 'Bearer <token>'")
        return value.strip()
    return request.cookies.get(COOKIE)


def authenticate(state: ServerState, request: Request) -> Principal:
    """Who makes the request (blocking: it reads the tokens table)."""
    token = bearer(request)
    if (token is not None and "authorization" not in request.headers
            and request.method not in ("GET", "HEAD") and request.headers.get("x-cairn-csrf") != "1"):
        # a cookie rides along with any cross-site form post; a custom header cannot (no CORS here)
        raise ApiError(403, "forbidden", "a request authenticated by the dashboard's cookie must send "
                                         "the header X-Cairn-CSRF: 1")
    if token is None:
        raise ApiError(401, "unauthorized", "a bearer token is required (Authorization: Bearer <token>)")
    try:
        return state.app.tokens.check(token)
    except TokenRefused as exc:
        raise ApiError(401, "unauthorized", str(exc)) from None


def authorize(principal: Principal, needed: Role) -> None:
    if not principal.role.allows(needed):
        raise ApiError(403, "forbidden", f"this needs the {needed.value} role; the token has "
                                         f"{principal.role.value}")


#: what a stream's query may hold: its cursor (``events.run_cursor``, ``events.tenant_cursor``)
STREAM_QUERY = frozenset({"after"})


def check_query_names(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    """The query as one value per name, refusing a name the endpoint does
    not take (a misspelt ``limt`` silently meant the default) or a name
    given twice (which one counted was the framework's choice)."""
    given: dict[str, str] = {}
    for key, value in request.query_params.multi_items():
        if key not in allowed:
            takes = ", ".join(sorted(allowed)) if allowed else "none"
            raise ApiError(400, "invalid",
                           f"unknown query parameter {key[:40]!r} (this endpoint takes: {takes})")
        if key in given:
            raise ApiError(400, "invalid", f"query parameter {key[:40]!r} is given more than once")
        given[key] = value
    return given


def _decode_query(kind: type[Any], request: Request) -> Any:
    if kind is NoQuery:
        check_query_names(request, frozenset())
        return None
    raw: dict[str, Any] = check_query_names(
        request, frozenset(f.encode_name for f in msgspec.structs.fields(kind)))
    try:
        return msgspec.convert(raw, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise ApiError(400, "invalid", f"bad query parameter: {exc}") from None


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


def _integral(decoded: Any, kind: type[Any]) -> Any:
    """JSON (and JSON Schema) make no difference between ``5`` and ``5.0``;
    msgspec refuses ``5.0`` for an ``int``. The request's own fields read an
    integral number as an integer; a field of any JSON (a run's input, a
    signal's data, an edit) is the user's and passes through untouched."""
    if not isinstance(decoded, dict):
        return decoded
    free = {f.encode_name for f in msgspec.structs.fields(kind) if f.type is Any or Any in get_args(f.type)}
    return {k: v if k in free else _whole(v) for k, v in decoded.items()}


#: msgspec quotes a refused string's whole pattern; the pattern is in the API document
_PATTERN_MISMATCH = re.compile(r"Expected `str` matching regex '.*' - at")


def _decode_body(kind: type[Any], data: bytes) -> Any:
    if kind is NoBody:
        return None
    if not data.strip():
        data = b"{}"
    try:
        return msgspec.convert(_integral(msgspec.json.decode(data), kind), kind)
    except msgspec.ValidationError as exc:
        problem = _PATTERN_MISMATCH.sub(
            "Expected `str` of the form its pattern in /api/openapi.json gives - at", str(exc))
        raise ApiError(400, "invalid", f"bad request body: {problem}") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "invalid", f"the request body is not JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid", "the request body is nested too deeply") from None


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_BODY):
        raise ApiError(413, "too_large", f"request bodies are limited to {MAX_BODY} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, "too_large", f"request bodies are limited to {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def endpoint_function(state: ServerState, spec: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint of ``spec``: authenticate, authorize, parse,
    call the handler in a thread, answer JSON; every error as JSON."""

    async def endpoint(request: Request) -> Response:
        try:
            principal = await run_in_threadpool(authenticate, state, request)
            authorize(principal, spec.role)
            if spec.stream is not None:
                check_query_names(request, STREAM_QUERY)
                return await spec.stream(request, state, principal)
            assert spec.handler is not None
            body = _decode_body(spec.body, await _read_body(request)) if spec.body is not NoBody else None
            query = _decode_query(spec.query, request)
            operator = state.app.operator.acting_as(principal.actor)
            path = dict(request.path_params)
            call: Call[Any] = Call(request, state.app, principal, operator, body, query, path)
            if inspect.iscoroutinefunction(spec.handler):  # it waits: on the loop, not in a thread
                result = await spec.handler(call)
            else:
                result = await run_in_threadpool(spec.handler, call)
        except Exception as exc:
            return response_for(exc)
        if isinstance(result, Response):
            return result
        try:  # an answer JSON cannot render is the server's bug: answered as one (500, logged), never raised
            return JSONResponse(result, status_code=spec.status)
        except (ValueError, TypeError, RecursionError) as exc:
            return response_for(RuntimeError(f"cannot render the answer of {spec.method} {spec.path}: {exc}"))

    endpoint.__name__ = spec.handler.__name__ if spec.handler is not None else "stream"
    return endpoint


class EncodedRoute(Route):
    """A route matched against the path as the client sent it (percent-encoded).

    A server decodes ``%2F`` to ``/`` before routing, so a run id holding a
    ``/`` would split ``/api/runs/{run_id}/events`` at the wrong place (run
    ``a`` of ``a%2Fevents`` and the event stream of run ``a`` would be one
    path). Matching the raw path keeps each ``{parameter}`` one segment, and
    each is decoded on its own: every id works, percent-encoded, in every
    route. Without a raw path (an ASGI server that gives none) it matches
    the decoded path as a plain ``Route`` does.
    """

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw = scope.get("raw_path")
        if scope["type"] != "http" or not isinstance(raw, bytes):
            return super().matches(scope)
        path = raw.decode("latin-1").partition("?")[0]
        root = scope.get("root_path", "")
        if root:  # mounted: drop the mount's segments (the decoded path starts with them)
            parts = path.split("/")
            path = "/" + "/".join(parts[root.count("/") + 1:])
        found = self.path_regex.match(path)
        if found is None:
            return Match.NONE, {}
        params = {name: unquote_to_bytes(value.encode("latin-1")).decode("utf-8", "replace")
                  for name, value in found.groupdict().items()}
        child: Scope = {"endpoint": self.endpoint, "path_params": {**scope.get("path_params", {}), **params}}
        if self.methods and scope["method"] not in self.methods:
            return Match.PARTIAL, child
        return Match.FULL, child


def starlette_route(state: ServerState, spec: Endpoint) -> Route:
    """The Starlette route serving ``spec`` (see ``EncodedRoute``)."""
    return EncodedRoute(spec.path, endpoint_function(state, spec), methods=[spec.method])
