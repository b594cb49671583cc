"""A client for OpenAI-compatible chat-completions servers.

Works with the OpenAI API and with the many servers that speak the same wire
format (vLLM, llama.cpp, Ollama, LiteLLM, ...): point ``base_url`` at them.
Only the request and the response reach the journal (``Context.model``
records them); the API key lives in this object's HTTP headers and nowhere
else, so it never ends up in the database, a history dump or a log line.
With ``api_key=cairn.Secret("openai")`` the object holds no key at all: the
reference is resolved on every call, through the running App's secrets (a
key rotated meanwhile is the one sent), and a 401 answer refreshes it
through its provider and sends the request once more.

Failures are split by what a retry can achieve. ``ModelUnavailable`` (rate
limits, server errors, network trouble, timeouts) may succeed later, so a
workflow can pass ``retry=cairn.RetryPolicy(retry_on=(ModelUnavailable,))``
to ``ctx.model``. ``ModelRequestError`` (a rejected request, an unusable
answer) will fail the same way again.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from cairn.errors import CairnError, MissingExtra
from cairn.models.base import FunctionCall, Message, ModelRequest, ModelResponse, ToolCall, Usage
from cairn.models.errors import (
    ModelRequestError,
    ModelUnavailable,
    error_code,
    error_message,
)
from cairn.security.secrets import Secret, Secrets

try:
    import httpx
except ImportError as exc:
    raise MissingExtra("cairn.models.openai", "openai") from exc

from cairn.models.transport import RETRYABLE_STATUSES, HTTPModel, Malformed, endpoint, token_counts

__all__ = ["DEFAULT_BASE_URL", "ModelRequestError", "ModelUnavailable", "OpenAIChat"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIChat(HTTPModel):
    """An OpenAI-compatible chat model, usable as ``ctx.model(client, ...)``.

    ``base_url`` defaults to ``$CAIRN_OPENAI_BASE_URL``, then
    ``$OPENAI_BASE_URL``, then the OpenAI API; it may carry a query string
    (Azure's ``?api-version=...``), kept after ``/chat/completions``. ``api_key``
    defaults to ``$CAIRN_OPENAI_API_KEY``, then ``$OPENAI_API_KEY``; without a
    key no ``Authorization`` header is sent (local servers often need none).
    ``api_key=cairn.Secret("openai")`` resolves the key on every call, from
    the running App's secrets (or from ``secrets=``, outside a run); a 401
    answer then refreshes it through its provider and sends the request once
    more (a rejected request did nothing, so sending it again is safe).
    With ``price_per_1k_input``/``price_per_1k_output`` each response carries
    its cost, which counts against a run's budget.

    Secrets stay out of everything this object shows: the key, credentials in
    ``base_url`` (``https://user:KEY@host``), secret-looking query values
    (``?api-key=...``) and ``extra_headers`` values (``api-key``,
    ``Authorization``...) are masked in ``base_url``, ``repr`` and every error
    message (so in the journal and the CLI), even when a server echoes them.

    ``timeout`` bounds the whole call (connecting, sending, every read of the
    answer together), not each read: a server trickling bytes cannot hold a
    call past it. (Through a proxy taken from the environment, a sync call is
    bounded per read only: httpx builds that transport itself.)

    ``stream=True`` is refused before sending: the journal records one whole
    response per call.

    HTTP clients are created on first use and reused, so connections are
    pooled across calls. Async calls get one client per event loop, because
    an ``httpx.AsyncClient`` is tied to the loop it first ran on and Cairn
    runs one loop per worker thread. ``close()`` (or ``with``) releases them.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | Secret | None = None,
        timeout: float = 60.0,
        price_per_1k_input: float | None = None,
        price_per_1k_output: float | None = None,
        extra_headers: dict[str, str] | None = None,
        secrets: Secrets | None = None,
    ) -> None:
        raw_url = (
            base_url or os.environ.get("CAIRN_OPENAI_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
            or DEFAULT_BASE_URL
        )
        key_ref = api_key if isinstance(api_key, Secret) else None
        key: str | None = None
        if key_ref is None:
            key = (api_key if isinstance(api_key, str) else None) or os.environ.get("CAIRN_OPENAI_API_KEY") \
                or os.environ.get("OPENAI_API_KEY") or None
        url, shown_url, url_secrets = endpoint(raw_url, "/chat/completions")
        super().__init__(
            model, url=url, shown_url=shown_url, url_secrets=url_secrets, key=key, key_ref=key_ref,
            key_header=("Authorization", "Bearer {key}"), timeout=timeout,
            headers={"Accept": "application/json", "Content-Type": "application/json"},
            extra_headers=extra_headers, secrets=secrets,
        )
        self.price_per_1k_input = price_per_1k_input
        self.price_per_1k_output = price_per_1k_output

    def __repr__(self) -> str:
        return f"OpenAIChat(model={self.model!r}, base_url={self.base_url!r}, api_key={self._key_repr()})"

    # -- calls -----------------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` and return the first choice of the answer."""
        return self._response(self._post(self._body(request)))

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """``complete`` without blocking the event loop (``ctx.model_async`` uses it)."""
        return self._response(await self._apost(self._body(request)))

    def _body(self, request: ModelRequest) -> bytes:
        # a streamed answer arrives as server-sent events this client does not
        # assemble: refuse before anything is sent (and paid for)
        if request.params.get("stream"):
            raise self._rejected("stream=True is not supported; the call is journaled as one whole response, "
                                 "so leave 'stream' out of the params")
        body: dict[str, Any] = {"model": self.model, "messages": [_wire_message(m) for m in request.messages]}
        if request.tools:
            body["tools"] = list(request.tools)
        body.update(request.params)
        return msgspec.json.encode(body)

    answer_name = "chat completion"

    def _status_error(self, response: httpx.Response) -> CairnError | None:
        if response.status_code == 429 and error_code(response) == "insufficient_quota":
            # an exhausted quota or billing limit does not lift by waiting
            return self._rejected(f"HTTP 429: {error_message(response)}", 429)
        return None

    def _body_error(self, body: Any, response: httpx.Response) -> CairnError | None:
        if not (isinstance(body, dict) and "error" in body and not body.get("choices")):
            return None
        # gateways (OpenRouter, LiteLLM...) report failures with a 200 and an
        # error body, whose numeric code says whether waiting can help
        error = body["error"]
        code = error.get("code") if isinstance(error, dict) else None
        retryable = isinstance(code, int) and not isinstance(code, bool) and (
            code in RETRYABLE_STATUSES or code >= 500)
        return self._in_body(response, retryable)

    def _parse(self, body: Any) -> ModelResponse:
        if not isinstance(body, dict):
            raise Malformed(f"expected a JSON object, got {type(body).__name__}")
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise Malformed("no choices")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise Malformed("the first choice has no message")
        raw = choice["message"]
        content = raw.get("content")
        if isinstance(content, list) and all(isinstance(part, dict) for part in content):
            content = tuple(content)  # content parts
        elif content is not None and not isinstance(content, str):
            raise Malformed(f"message content is a {type(content).__name__}, not a string or parts")
        calls = raw.get("tool_calls") or []
        if not isinstance(calls, list):
            raise Malformed("tool_calls is not a list")
        message = Message(
            role=str(raw.get("role") or "assistant"),
            content=content,
            tool_calls=tuple(_tool_call(call, i) for i, call in enumerate(calls)),
            refusal=_text(raw, "refusal"),
            function_call=_function_call(raw.get("function_call")),
        )
        return self._answer(message, body, choice.get("finish_reason"), _usage(body.get("usage")))

    def _cost(self, usage: Usage) -> float | None:
        if self.price_per_1k_input is None and self.price_per_1k_output is None:
            return None
        return (usage.prompt_tokens * (self.price_per_1k_input or 0.0)
                + usage.completion_tokens * (self.price_per_1k_output or 0.0)) / 1000


def _wire_message(message: Message) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, (tuple, list)):  # multimodal parts, as given
        wire["content"] = list(message.content)
    elif message.content is not None:
        wire["content"] = message.content
    if message.refusal is not None:
        wire["refusal"] = message.refusal
    if message.tool_calls:
        wire["tool_calls"] = [_wire_call(c) for c in message.tool_calls]
    if message.function_call is not None:
        wire["function_call"] = {"name": message.function_call.name,
                                 "arguments": message.function_call.arguments}
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        wire["name"] = message.name
    return wire


def _wire_call(call: ToolCall) -> dict[str, Any]:
    if call.type == "custom":
        return {"id": call.id, "type": "custom", "custom": {"name": call.name, "input": call.arguments}}
    return {"id": call.id, "type": call.type, "function": {"name": call.name, "arguments": call.arguments}}


def _text(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise Malformed(f"message {key} is a {type(value).__name__}, not a string")
    return value


def _function_call(raw: Any) -> FunctionCall | None:
    """The legacy ``function_call`` of a message (``functions=`` requests)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise Malformed("function_call has no name")
    return FunctionCall(name=raw["name"], arguments=_arguments(raw.get("arguments")))


def _tool_call(raw: Any, index: int) -> ToolCall:
    if not isinstance(raw, dict):
        raise Malformed(f"tool call {index} is not an object")
    call_id = raw.get("id")
    # some local servers omit ids; a positional id is stable, and the response is journaled anyway
    call_id = call_id if isinstance(call_id, str) and call_id else f"call_{index}"
    kind = raw.get("type") or "function"
    if kind == "custom":
        custom = raw.get("custom")
        if not isinstance(custom, dict) or not isinstance(custom.get("name"), str) or not custom["name"]:
            raise Malformed(f"custom tool call {index} has no name")
        text = custom.get("input")
        if not isinstance(text, str):
            raise Malformed(f"custom tool call {index} has no input")
        return ToolCall(id=call_id, name=custom["name"], arguments=text, type="custom")
    function = raw.get(kind) if isinstance(kind, str) else None
    if not isinstance(function, dict):
        raise Malformed(f"tool call {index} has no {kind}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise Malformed(f"tool call {index} has no function name")
    return ToolCall(id=call_id, name=name, arguments=_arguments(function.get("arguments")), type=kind)


def _arguments(value: Any) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    # some compatible servers send the arguments as an object instead of a JSON string
    return msgspec.json.encode(value).decode()


def _usage(raw: Any) -> Usage:
    prompt, completion, total = token_counts(raw, "prompt_tokens", "completion_tokens", "total_tokens")
    return Usage(prompt, completion, total or prompt + completion)
