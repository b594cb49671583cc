"""A client for Anthropic's Messages API (``POST /v1/messages``).

Workflows speak one message format (``cairn.models.base``, the chat-completions
shape); this adapter translates it to the Messages API and back, so the same
agent loop runs on either provider:

* system messages become the top-level ``system``; a ``tool`` message becomes
  a ``tool_result`` block of a user turn, and consecutive turns of one role
  are merged (the API wants a tool's result in the turn right after its call);
* tools in the chat-completions shape become ``{name, description,
  input_schema}``; a tool already in Anthropic's shape (a server tool such
  as ``web_search_...``) is sent as given;
* an answer's ``tool_use`` blocks become ``ToolCall`` s. An answer made only
  of plain text becomes a text message; an answer with any other block
  (``thinking``, ``redacted_thinking``, ``compaction``, server tool results,
  text with citations) keeps *all* its blocks verbatim as the message's
  content parts, so the journal holds exactly what the provider returned and
  the next request sends it back unchanged, as the API requires (thinking
  signatures, compaction items). The answer's ``context_management`` (the
  context edits the API applied) is kept in ``ModelResponse.provider``.

Usage: ``prompt_tokens`` is every input token (uncached, written to and read
from the cache), ``cache_read_tokens``/``cache_write_tokens`` say how many
were cached. Failures are classified as the OpenAI adapter does: 408, 429,
529 (overloaded) and 5xx are ``ModelUnavailable`` with the server's
``Retry-After``; any other refusal and any answer that is not a message is a
``ModelRequestError``. ``stream=True`` is refused before sending. The key
(``x-api-key``) is kept and masked exactly as in ``cairn.models.openai``
(``cairn.models.transport``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec

from cairn.errors import CairnError, MissingExtra
from cairn.models.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from cairn.security.secrets import Secret, Secrets

try:
    import httpx
except ImportError as exc:
    raise MissingExtra("cairn.models.anthropic", "anthropic") from exc

from cairn.models.transport import HTTPModel, Malformed, endpoint, token_counts

__all__ = ["API_VERSION", "COMPACTION_BETA", "COMPACTION_EDIT", "CONTEXT_EDITING_BETA", "DEFAULT_BASE_URL",
           "AnthropicChat"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
#: the ``anthropic-version`` header: the API version whose wire format this speaks
API_VERSION = "2023-06-01"
#: ``max_tokens`` is required by the API; this is sent when the params have none
DEFAULT_MAX_TOKENS = 4096
#: the context edit by which the API compacts a conversation itself, and the
#: beta features that enable it and the other context edits (clearing tool
#: uses, thinking): added to ``anthropic-beta`` when a request uses them
COMPACTION_EDIT = "compact_20260112"
COMPACTION_BETA = "compact-2026-01-12"
CONTEXT_EDITING_BETA = "context-management-2025-06-27"


class AnthropicChat(HTTPModel):
    """An Anthropic model, usable as ``ctx.model(client, ...)``.

    ``base_url`` defaults to ``$CAIRN_ANTHROPIC_BASE_URL``, then
    ``$ANTHROPIC_BASE_URL``, then the Anthropic API (``/v1/messages`` is
    appended); ``api_key`` to ``$CAIRN_ANTHROPIC_API_KEY``, then
    ``$ANTHROPIC_API_KEY``, or a ``cairn.Secret`` resolved on every call and
    refreshed once on a 401. ``beta``: feature names sent in
    ``anthropic-beta`` (context editing, compaction...), whose request
    fields go in the call's params (``context_management=...``).
    ``max_tokens`` is sent when a call's params do not set it. Prices per
    1000 tokens give each response its cost (cache reads and writes default
    to the input price).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | Secret | None = None,
        timeout: float = 60.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        beta: Sequence[str] = (),
        price_per_1k_input: float | None = None,
        price_per_1k_output: float | None = None,
        price_per_1k_cache_read: float | None = None,
        price_per_1k_cache_write: float | None = None,
        extra_headers: dict[str, str] | None = None,
        secrets: Secrets | None = None,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, not {max_tokens!r}")
        env = os.environ.get
        raw_url = base_url or env("CAIRN_ANTHROPIC_BASE_URL") or env("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL
        key_ref = api_key if isinstance(api_key, Secret) else None
        key: str | None = None
        if key_ref is None:
            key = (api_key if isinstance(api_key, str) else None) or env("CAIRN_ANTHROPIC_API_KEY") \
                or env("ANTHROPIC_API_KEY") or None
        url, shown_url, url_secrets = endpoint(raw_url, "/v1/messages")
        headers = {"Accept": "application/json", "Content-Type": "application/json",
                   "anthropic-version": API_VERSION}
        self.beta = tuple(beta)
        if beta:
            headers["anthropic-beta"] = ",".join(beta)
        super().__init__(
            model, url=url, shown_url=shown_url, url_secrets=url_secrets, key=key, key_ref=key_ref,
            key_header=("x-api-key", "{key}"), timeout=timeout, headers=headers,
            extra_headers=extra_headers, secrets=secrets,
        )
        self.max_tokens = max_tokens
        self.price_per_1k_input = price_per_1k_input
        self.price_per_1k_output = price_per_1k_output
        self.price_per_1k_cache_read = price_per_1k_cache_read
        self.price_per_1k_cache_write = price_per_1k_cache_write

    def __repr__(self) -> str:
        return f"AnthropicChat(model={self.model!r}, base_url={self.base_url!r}, api_key={self._key_repr()})"

    # -- calls -----------------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` and return the answer."""
        return self._response(self._post(self._body(request), self._betas(request)))

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """``complete`` without blocking the event loop (``ctx.model_async`` uses it)."""
        return self._response(await self._apost(self._body(request), self._betas(request)))

    def compaction_params(self, threshold: int) -> dict[str, Any]:
        """The params that make the API compact the conversation itself once
        its input passes ``threshold`` tokens (``ContextPolicy(provider=True)``
        adds them): the answer then carries a ``compaction`` block, kept
        verbatim, and the API ignores every message before it."""
        return {"context_management": {"edits": [
            {"type": COMPACTION_EDIT, "trigger": {"type": "input_tokens", "value": threshold}}]}}

    def _betas(self, request: ModelRequest) -> dict[str, str] | None:
        """The ``anthropic-beta`` header a request's ``context_management``
        needs, beside the client's own ``beta`` features."""
        edits = request.params.get("context_management")
        if not isinstance(edits, dict):
            return None
        kinds = {str(e.get("type", "")) for e in edits.get("edits") or () if isinstance(e, dict)}
        needed = [COMPACTION_BETA] if any(k.startswith("compact_") for k in kinds) else []
        if kinds - {COMPACTION_EDIT}:
            needed.append(CONTEXT_EDITING_BETA)
        features = [*self.beta, *(b for b in needed if b not in self.beta)]
        return {"anthropic-beta": ",".join(features)} if features else None

    def _body(self, request: ModelRequest) -> bytes:
        if request.params.get("stream"):
            raise self._rejected("stream=True is not supported; the call is journaled as one whole response, "
                                 "so leave 'stream' out of the params")
        try:
            system, messages = _wire_messages(request.messages)
        except _Unsendable as exc:
            raise self._rejected(f"cannot send the request: {exc}") from None
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages}
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [_wire_tool(tool) for tool in request.tools]
        body.update(request.params)
        return msgspec.json.encode(body)

    answer_name = "message"

    def _body_error(self, body: Any, response: httpx.Response) -> CairnError | None:
        if not (isinstance(body, dict) and body.get("type") == "error"):
            return None
        # a proxy may wrap an error in a 200: overloaded and rate limits may pass, the rest will not
        error = body.get("error")
        kind = error.get("type") if isinstance(error, dict) else None
        return self._in_body(response, kind in ("overloaded_error", "rate_limit_error", "api_error",
                                                "timeout_error"))

    def _parse(self, body: Any) -> ModelResponse:
        if not isinstance(body, dict):
            raise Malformed(f"expected a JSON object, got {type(body).__name__}")
        blocks = body.get("content")
        if not isinstance(blocks, list):
            raise Malformed("no content list")
        calls: list[ToolCall] = []
        plain = True
        for i, block in enumerate(blocks):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise Malformed(f"content block {i} has no type")
            kind = block["type"]
            if kind == "text":
                if not isinstance(block.get("text"), str):
                    raise Malformed(f"text block {i} has no text")
                plain = plain and set(block) <= {"type", "text"}
            elif kind == "tool_use":
                calls.append(_tool_call(block, i))
            else:
                plain = False  # thinking, compaction, server tools...: kept verbatim
        content: str | tuple[dict[str, Any], ...] | None
        if plain:
            text = "".join(b["text"] for b in blocks if b["type"] == "text")
            content = text if any(b["type"] == "text" for b in blocks) else None
        else:
            content = tuple(blocks)
        role = body.get("role")
        message = Message(role=role if isinstance(role, str) and role else "assistant", content=content,
                          tool_calls=tuple(calls))
        provider = body.get("context_management")
        return self._answer(message, body, body.get("stop_reason"), _usage(body.get("usage")),
                            {"context_management": provider} if isinstance(provider, dict) else None)

    def _cost(self, usage: Usage) -> float | None:
        if self.price_per_1k_input is None and self.price_per_1k_output is None:
            return None
        price_in = self.price_per_1k_input or 0.0
        read = self.price_per_1k_cache_read if self.price_per_1k_cache_read is not None else price_in
        write = self.price_per_1k_cache_write if self.price_per_1k_cache_write is not None else price_in
        uncached = usage.prompt_tokens - usage.cache_read_tokens - usage.cache_write_tokens
        return (uncached * price_in + usage.cache_read_tokens * read + usage.cache_write_tokens * write
                + usage.completion_tokens * (self.price_per_1k_output or 0.0)) / 1000


class _Unsendable(Exception):
    """A request this adapter cannot express in the Messages API."""


def _wire_messages(messages: Sequence[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``system`` blocks and the turns, consecutive turns of one role merged."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role in ("system", "developer"):
            system.extend(_blocks(message.content))
            continue
        if message.role == "tool":
            if not message.tool_call_id:
                raise _Unsendable("a tool message has no tool_call_id")
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
            if message.content:
                result["content"] = message.content if isinstance(message.content, str) \
                    else _blocks(message.content)
            role, blocks = "user", [result]
        elif message.role in ("user", "assistant"):
            role, blocks = message.role, _blocks(message.content)
            if message.role == "assistant":
                blocks += _tool_uses(message.tool_calls, blocks)
        else:
            raise _Unsendable(f"a message has role {message.role!r} (the Messages API has user and assistant "
                              "turns, plus system and tool messages this adapter converts)")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _blocks(content: str | tuple[dict[str, Any], ...] | None) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [_block(part) for part in content]


def _block(part: dict[str, Any]) -> dict[str, Any]:
    """A content part as the Messages API takes it: an image given in the
    chat-completions shape (``image_url``) is converted, anything else
    (text, Anthropic's own blocks) is sent verbatim."""
    if part.get("type") != "image_url":
        return part
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise _Unsendable("an image_url part has no url")
    if url.startswith("data:"):
        header, _, data = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if encoding != "base64" or not data:
            raise _Unsendable("an image data URL must be base64 (data:<type>;base64,...)")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _tool_uses(calls: Sequence[ToolCall], blocks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tool_use`` blocks for the calls the content does not already hold
    (an answer kept verbatim carries its own)."""
    present = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
    uses = []
    for call in calls:
        if call.id in present:
            continue
        try:
            arguments = msgspec.json.decode(call.arguments) if call.arguments.strip() else {}
        except msgspec.DecodeError:
            raise _Unsendable(f"the arguments of tool call {call.id!r} are not JSON") from None
        if not isinstance(arguments, dict):
            raise _Unsendable(f"the arguments of tool call {call.id!r} are not a JSON object")
        uses.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return uses


def _wire_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions function tool as an Anthropic tool; any other shape verbatim."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        return tool
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    wire: dict[str, Any] = {"name": function.get("name"), "input_schema": schema}
    if function.get("description"):
        wire["description"] = function["description"]
    return wire


def _tool_call(block: dict[str, Any], index: int) -> ToolCall:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise Malformed(f"tool_use block {index} has no id")
    if not isinstance(name, str) or not name:
        raise Malformed(f"tool_use block {index} has no name")
    if not isinstance(arguments, dict):
        raise Malformed(f"tool_use block {index} has no input object")
    return ToolCall(id=call_id, name=name, arguments=msgspec.json.encode(arguments).decode())


def _usage(raw: Any) -> Usage:
    fresh, completion, read, write = token_counts(
        raw, "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    prompt = fresh + read + write
    return Usage(prompt, completion, prompt + completion, cache_read_tokens=read, cache_write_tokens=write)
