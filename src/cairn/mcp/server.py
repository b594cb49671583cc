"""An MCP server's tools as journaled Cairn tools.

``MCPServer(name, command=[...] | url=..., egress=...)`` describes a server;
inside a workflow:

* ``server.tools()`` lists its tools, journaled once per run (a ``mcp``
  entry): every later call of the run, and every replay, sees that list,
  whatever the server says meanwhile. It returns them as tool specs for a
  model (chat-completions shape, named ``<server>__<tool>``); the journal
  names the calls ``<server>.<tool>``.
* ``server.call(name, arguments)`` (or ``server.call(tool_call)``) calls one
  through the operation ledger, with the effect class of the recorded list:
  ``readOnlyHint`` -> ``read``, ``idempotentHint`` -> ``idempotent`` (the
  operation id sent as the tool's ``idempotency_key`` argument where its
  schema has one), anything else -> ``write`` (so an uncertain call after a
  crash goes to ``needs_attention`` unless ``reconcile=`` gives a reconciler).
  Hints come from a server Cairn does not trust, so ``effects=`` (the app's
  own configuration) overrides them; a hint can only make a tool *less*
  trusted than the app says, never more.

A call is refused (recorded as a failed ``tool`` entry, never sent) when the
recorded list has no such tool, or when ``access=`` denies the run's tenant
or workflow. A server is started (``command``) or reached (``url``) only if
the app's ``Egress`` allows it. Each call has a ``timeout``; a result must
match the tool's ``outputSchema`` when it declares one; a large result is
stored by reference like any large payload (the artifact store).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import msgspec

from cairn.engine.access import ToolAccess, ToolRefused, refuse
from cairn.engine.execution import Execution, current
from cairn.engine.tools import Effect, Operation, Reconciler, Tool, ToolDef
from cairn.errors import CairnError, EffectNotApplied, InvalidArgument, ToolResultInvalid
from cairn.mcp.connection import Connection, MCPUnavailable, http_transport, stdio_transport
from cairn.models.base import ToolCall
from cairn.retry import RetryPolicy, TerminalError

__all__ = ["Egress", "EgressRefused", "MCPServer", "MCPToolError", "MCPUnavailable", "ToolAccess",
           "ToolRefused"]


#: listing the tools is a read: a server still starting or briefly gone is
#: asked again (an egress refusal is an ``InvalidArgument``: never retried)
_LIST_RETRY = RetryPolicy(max_attempts=3, initial_delay=1.0, backoff=2.0, retry_on=(MCPUnavailable,))

#: a server's name, and a tool name as model providers take it
_SERVER_NAME = re.compile(r"[A-Za-z0-9-]{1,32}")
_MODEL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class EgressRefused(InvalidArgument):
    """The app's egress rule does not allow starting or reaching this server."""


class MCPToolError(TerminalError, EffectNotApplied):
    """The server answered the call with an error result (``isError``)."""


@dataclass(frozen=True)
class Egress:
    """Which MCP servers an app may start (``commands``: executables, by
    path or by a name found on ``PATH``) and reach (``urls``: prefixes such
    as ``https://tools.example/mcp``, or ``http://127.0.0.1:*`` for any
    port of a host). Nothing else is started or reached."""

    commands: Sequence[str] = ()
    urls: Sequence[str] = ()

    def check_command(self, command: Sequence[str]) -> None:
        if not command:
            raise EgressRefused("an MCP server command is empty")
        wanted = _resolved(command[0])
        if wanted is None or wanted not in {_resolved(c) for c in self.commands}:
            raise EgressRefused(f"egress refused: the app may not start MCP server command {command[0]!r}")

    def check_url(self, url: str) -> None:
        if not any(_url_within(url, allowed) for allowed in self.urls):
            raise EgressRefused(f"egress refused: the app may not reach MCP server {url!r}")


class Listed(msgspec.Struct, frozen=True, omit_defaults=True):
    """One tool as the run's journaled list records it."""

    name: str
    effect: str
    input_schema: dict[str, Any]
    description: str | None = None
    output_schema: dict[str, Any] | None = None
    hints: dict[str, Any] = msgspec.field(default_factory=dict)


@dataclass
class MCPServer:
    """An MCP server over stdio (``command``) or streamable HTTP (``url``)."""

    name: str
    egress: Egress
    command: Sequence[str] | None = None
    url: str | None = None
    env: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    timeout: float = 30.0
    #: how long starting a stdio server or reaching an HTTP one may take
    connect_timeout: float = 30.0
    effects: Mapping[str, Effect | str] = field(default_factory=dict)
    access: Mapping[str, ToolAccess] = field(default_factory=dict)
    reconcile: Mapping[str, Reconciler] = field(default_factory=dict)
    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise InvalidArgument(f"MCP server {self.name!r}: give command= (stdio) or url= (HTTP), not both")
        if not isinstance(self.name, str) or not _SERVER_NAME.fullmatch(self.name):
            raise InvalidArgument(f"an MCP server name is 1 to 32 letters, digits and '-', not {self.name!r}")
        if not self.timeout > 0:
            raise InvalidArgument(f"MCP server {self.name!r}: timeout must be > 0 seconds")
        for tool, effect in self.effects.items():
            try:
                Effect(effect)
            except ValueError:
                raise InvalidArgument(f"MCP server {self.name!r}: effect {effect!r} of tool {tool!r} is not "
                                      "read, idempotent or write") from None
        self._connection: Connection | None = None
        self._lock = threading.Lock()
        self._lists: dict[int, dict[str, Listed]] = {}
        self._tools: dict[tuple[str, str, str, bool], Tool[..., Any]] = {}

    def bundle_pin(self) -> dict[str, Any]:
        """The server as a bundle's code hash pins it (``engine.bundles``):
        what it is, what the app allows it, and the app's rules over its
        tools (effects, access, which have a reconciler). Changing any of
        them is a new bundle: a run keeps the rules it started under."""
        return {
            "name": self.name, "command": None if self.command is None else list(self.command),
            "url": self.url, "timeout": self.timeout,
            "egress": {"commands": list(self.egress.commands), "urls": list(self.egress.urls)},
            "effects": {tool: Effect(effect).value for tool, effect in sorted(self.effects.items())},
            "access": {tool: rule.pinned() for tool, rule in sorted(self.access.items())},
            "reconcile": sorted(self.reconcile),
        }

    # -- in a workflow --------------------------------------------------------------------

    def tools(self) -> list[dict[str, Any]]:
        """The server's tools as model tool specs, from the run's journaled
        list, named ``<server>__<tool>`` (providers take only letters,
        digits, ``_`` and ``-`` in a tool name, at most 64: a tool whose
        name cannot be so spelled is left out of the specs, though code may
        still call it by name)."""
        specs = []
        for t in self._listed(_execution()).values():
            name = f"{self.name}__{t.name}"
            if _MODEL_NAME.fullmatch(name):
                specs.append({"type": "function", "function": {
                    "name": name, "description": t.description or "", "parameters": t.input_schema}})
        return specs

    def call(self, tool: str | ToolCall, arguments: Mapping[str, Any] | None = None) -> Any:
        """Call ``tool`` (its name, with or without the ``<server>.`` prefix,
        or a model's ``ToolCall``) through the ledger; its result is
        ``{"text": ..., "content": [...], "structured": ...}``: the text
        blocks joined, the other blocks (images, audio, resources) as the
        server sent them, and the structured content if any."""
        listed, args = self._checked(tool, arguments)
        return self._tool(listed, False)(args)

    def acall(self, tool: str | ToolCall, arguments: Mapping[str, Any] | None = None) -> Awaitable[Any]:
        """``call`` for an async workflow: ``await server.acall(...)``. The
        call takes its position now (so calls started together keep their
        order, as local async tools do); awaiting it sends the request
        without a thread or a blocked loop. The run's tool list, if not yet
        journaled, is listed at this call (``tools()`` first avoids that)."""
        listed, args = self._checked(tool, arguments)
        result: Awaitable[Any] = self._tool(listed, True)(args)
        return result

    def _checked(self, tool: str | ToolCall,
                 arguments: Mapping[str, Any] | None) -> tuple[Listed, dict[str, Any]]:
        """The listed tool and the arguments of a call, or the recorded refusal."""
        if isinstance(tool, ToolCall):
            name, args = tool.name, tool.parsed_arguments()
        else:
            name, args = tool, dict(arguments or {})
        name = name.removeprefix(f"{self.name}__").removeprefix(f"{self.name}.")
        ex = _execution()
        listed = self._listed(ex).get(name)
        if listed is None:
            self._refuse(ex, name, f"the run's list of MCP server {self.name!r} has no tool {name!r}")
        assert listed is not None
        refusal = self.access.get(name, ToolAccess()).refusal_in(ex)
        if refusal is not None:
            self._refuse(ex, name, f"tool {self.name}.{name} refused: {refusal}")
        if not isinstance(args, dict):
            self._refuse(ex, name, f"the arguments of {self.name}.{name} are not a JSON object")
        return listed, args

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    # -- the journaled list ------------------------------------------------------------------

    def _listed(self, ex: Execution) -> dict[str, Listed]:
        """The run's list, journaled at its first use in the run (then kept
        for the execution: a replay re-reads the same entry)."""
        key = id(ex)
        found = self._lists.get(key)
        if found is not None:
            return found
        call = ex.begin("mcp", f"{self.name}.tools")
        if call.recorded is not None:
            listed: list[Listed] = ex.replay(call, list[Listed])
        else:
            try:
                live = self._session().list_tools()
            except (MCPUnavailable, EgressRefused) as exc:
                ex.fail_by_policy(call, exc, self.retry or _LIST_RETRY)
            listed = ex.complete_call(call, [self._classified(t) for t in live], list[Listed],
                                      detail={"tools": len(live)})
        table = {t.name: t for t in listed}
        self._lists[key] = table
        ex_ref = ex
        _forget_with(ex_ref, lambda: self._lists.pop(key, None))
        return table

    def _classified(self, tool: Any) -> Listed:
        hints = tool.annotations.model_dump(exclude_none=True) if tool.annotations is not None else {}
        if tool.name in self.effects:
            effect = Effect(self.effects[tool.name])
        elif hints.get("readOnlyHint") is True:
            effect = Effect.READ
        elif hints.get("idempotentHint") is True:
            effect = Effect.IDEMPOTENT
        else:
            effect = Effect.WRITE
        return Listed(name=tool.name, effect=effect.value, input_schema=dict(tool.inputSchema),
                      description=tool.description, output_schema=tool.outputSchema, hints=hints)

    # -- calls -------------------------------------------------------------------------------

    def _tool(self, listed: Listed, is_async: bool) -> Tool[..., Any]:
        key = (listed.name, listed.effect, msgspec.json.encode(listed.output_schema).decode(), is_async)
        with self._lock:
            found = self._tools.get(key)
            if found is None:
                body = self._abody(listed) if is_async else self._body(listed)
                found = self._tools[key] = Tool(ToolDef.build(
                    body, name=f"{self.name}.{listed.name}", effect=listed.effect,
                    reconcile=self.reconcile.get(listed.name) if listed.effect == Effect.WRITE else None,
                    timeout=self.timeout, schema=None, retry=self.retry, reconcile_retry=None,
                    timed_by_body=True))
            return found

    def _body(self, listed: Listed) -> Callable[..., Any]:
        keyed = "idempotency_key" in (listed.input_schema.get("properties") or {})
        output = OutputCheck(self.name, listed)

        def body(op: Operation, arguments: dict[str, Any]) -> Any:
            if keyed and op.effect is not Effect.READ:
                arguments = {**arguments, "idempotency_key": op.operation_id}
            result = self._session().call_tool(listed.name, arguments, self.timeout)
            return _result(self.name, listed, result, output)

        return body

    def _abody(self, listed: Listed) -> Callable[..., Any]:
        keyed = "idempotency_key" in (listed.input_schema.get("properties") or {})
        output = OutputCheck(self.name, listed)

        async def body(op: Operation, arguments: dict[str, Any]) -> Any:
            if keyed and op.effect is not Effect.READ:
                arguments = {**arguments, "idempotency_key": op.operation_id}
            result = await self._session().acall_tool(listed.name, arguments, self.timeout)
            return _result(self.name, listed, result, output)

        return body

    def _refuse(self, ex: Execution, name: str, why: str) -> None:
        refuse(ex, f"{self.name}.{name}", why)

    def _session(self) -> Connection:
        with self._lock:
            if self._connection is None:
                if self.command is not None:
                    self.egress.check_command(self.command)
                    command = list(self.command)
                    env = dict(self.env) if self.env is not None else None
                    self._connection = Connection(self.name, stdio_transport(command, env),
                                                  self.connect_timeout)
                else:
                    assert self.url is not None
                    self.egress.check_url(self.url)
                    headers = dict(self.headers) if self.headers is not None else None
                    self._connection = Connection(self.name, http_transport(self.url, headers, self.timeout),
                                                  self.connect_timeout)
            return self._connection


class OutputCheck:
    """A tool's ``outputSchema``, compiled once per listed tool.

    ``jsonschema.validate`` checks the schema against its metaschema (with
    its ``$ref``s resolved) before every instance: that alone was most of
    what an MCP call cost beyond the direct call. A schema the metaschema
    refuses is still a failure of each call (``ToolResultInvalid``), as it
    was, not of the listing: the server's list is journaled as it is."""

    __slots__ = ("invalid", "validator", "where")

    def __init__(self, server: str, listed: Listed) -> None:
        self.where = f"{server}.{listed.name}"
        self.validator: Any = None
        self.invalid: str | None = None
        schema = listed.output_schema
        if schema is None:
            return
        try:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            self.validator = cls(schema)
        except jsonschema.SchemaError as exc:
            self.invalid = exc.message[:300]

    def check(self, structured: Any) -> None:
        if self.invalid is not None:
            raise ToolResultInvalid(self.where, f"its outputSchema is invalid: {self.invalid}")
        if self.validator is None:
            return
        if structured is None:
            raise ToolResultInvalid(self.where, "no structuredContent for its outputSchema")
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(structured))
        if error is not None:
            raise ToolResultInvalid(self.where, f"does not match its outputSchema: {error.message[:300]}")


def _result(server: str, listed: Listed, result: Any, output: OutputCheck | None = None) -> dict[str, Any]:
    content = [block.model_dump(mode="json", exclude_none=True) for block in result.content]
    text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    if result.isError:
        raise MCPToolError(f"MCP tool {server}.{listed.name} answered with an error: {text[:300]}")
    structured = result.structuredContent
    (output or OutputCheck(server, listed)).check(structured)
    # the text once: a 10 MB answer is not journaled twice
    others = [b for b in content if b.get("type") != "text"]
    return {"text": text, "content": others, "structured": structured}


def _execution() -> Execution:
    ex = current()
    if ex is None:
        raise CairnError("MCP tools are listed and called inside a workflow (the list is journaled per run)")
    return ex


def _resolved(command: str) -> str | None:
    path = command if os.sep in command else shutil.which(command)
    return os.path.realpath(path) if path else None


def _url_within(url: str, allowed: str) -> bool:
    """``url`` starts with ``allowed`` at a boundary (``http://a:1`` does not
    allow ``http://a:10``); ``allowed`` ending in ``:*`` allows any port."""
    if allowed.endswith(":*"):
        host = allowed[:-1]
        if not url.startswith(host):
            return False
        port, _, _ = url[len(host):].partition("/")
        return port.isdigit()
    if not url.startswith(allowed):
        return False
    rest = url[len(allowed):]
    return allowed.endswith("/") or rest == "" or rest[0] in "/?#"


def _forget_with(ex: Execution, forget: Callable[[], object]) -> None:
    import weakref

    weakref.finalize(ex, forget)
