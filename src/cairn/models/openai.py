"""A client for OpenAI-compatible chat-completions servers.

Works with the OpenAI API and with the many servers that speak the same wire
format (vLLM, llama.cpp, Ollama, LiteLLM, ...): point ``base_url`` at them.
Only the request and the response reach the journal (``Context.model``
records them); the API key lives in this object's HTTP headers and nowhere
else, so it never ends up in the database, a history dump or a log line.

Failures are split by what a retry can achieve. ``ModelUnavailable`` (rate
limits, server errors, network trouble, timeouts) may succeed later, so a
workflow can pass ``retry=cairn.RetryPolicy(retry_on=(ModelUnavailable,))``
to ``ctx.model``. ``ModelRequestError`` (a rejected request, an unusable
answer) will fail the same way again.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from types import TracebackType
from typing import Any, Self

import msgspec

from cairn.errors import CairnError
from cairn.models.base import Message, ModelRequest, ModelResponse, ToolCall, Usage
from cairn.retry import TerminalError

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("cairn.models.openai needs httpx: pip install 'cairn-runtime[openai]'") from exc

__all__ = ["DEFAULT_BASE_URL", "ModelRequestError", "ModelUnavailable", "OpenAIChat"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

#: Longest server error message kept in an exception: enough to diagnose,
#: short enough that an HTML error page does not flood the journal and the CLI.
_MAX_MESSAGE = 300


class ModelUnavailable(CairnError):
    """The model server could not answer now: rate limited (429), failing
    (5xx), unreachable or too slow. Retrying later may succeed.

    ``retry_after`` is the server's ``Retry-After`` hint in seconds, when it
    gave one as a number.
    """

    def __init__(self, message: str, *, status_code: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after


class ModelRequestError(TerminalError, CairnError):
    """The server refused the request (4xx other than 429), or answered with
    something that is not a chat completion. Sending the same request again
    would fail the same way, so it is a ``TerminalError``: never retried,
    whatever the call's retry policy says.

    ``status_code`` is the HTTP status (``None`` when the request never got
    an HTTP answer, e.g. an unsupported URL scheme).
    """

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class OpenAIChat:
    """An OpenAI-compatible chat model, usable as ``ctx.model(client, ...)``.

    ``base_url`` defaults to ``$CAIRN_OPENAI_BASE_URL``, then
    ``$OPENAI_BASE_URL``, then the OpenAI API; ``api_key`` to
    ``$CAIRN_OPENAI_API_KEY``, then ``$OPENAI_API_KEY``; without a key no
    ``Authorization`` header is sent (local servers often need none). With
    ``price_per_1k_input``/``price_per_1k_output`` each response carries its
    cost, which counts against a run's budget.

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
        api_key: str | None = None,
        timeout: float = 60.0,
        price_per_1k_input: float | None = None,
        price_per_1k_output: float | None = None,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        self.model_id = model
        self.model = model
        self.base_url = (
            base_url or os.environ.get("CAIRN_OPENAI_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
            or DEFAULT_BASE_URL
        ).rstrip("/")
        self.timeout = timeout
        self.price_per_1k_input = price_per_1k_input
        self.price_per_1k_output = price_per_1k_output
        self._url = f"{self.base_url}/chat/completions"
        key = api_key or os.environ.get("CAIRN_OPENAI_API_KEY") or os.environ.get("OPENAI_API_KEY") or None
        self._has_key = key is not None
        # the key is kept only inside the headers: no attribute, repr or error message shows it
        self._headers = {
            "Accept": "application/json", "Content-Type": "application/json", **(extra_headers or {}),
        }
        if key is not None:
            self._headers["Authorization"] = f"Bearer {key}"
        self._lock = threading.Lock()
        self._sync: httpx.Client | None = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        key = "'***'" if self._has_key else "None"
        return f"OpenAIChat(model={self.model!r}, base_url={self.base_url!r}, api_key={key})"

    # -- calls -----------------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` and return the first choice of the answer."""
        try:
            response = self._sync_client().post(self._url, content=self._body(request))
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise self._transport_error(exc) from exc
        return self._response(response)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """``complete`` without blocking the event loop (``ctx.model_async`` uses it)."""
        try:
            response = await self._async_client().post(self._url, content=self._body(request))
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise self._transport_error(exc) from exc
        return self._response(response)

    def _body(self, request: ModelRequest) -> bytes:
        body: dict[str, Any] = {"model": self.model, "messages": [_wire_message(m) for m in request.messages]}
        if request.tools:
            body["tools"] = list(request.tools)
        body.update(request.params)
        return msgspec.json.encode(body)

    def _response(self, response: httpx.Response) -> ModelResponse:
        status = response.status_code
        if status in (408, 429) or status >= 500:
            raise ModelUnavailable(
                f"{self.model} at {self._url}: HTTP {status}: {_error_message(response)}",
                status_code=status, retry_after=_retry_after(response),
            )
        if not 200 <= status < 300:
            raise ModelRequestError(
                f"{self.model} at {self._url}: HTTP {status}: {_error_message(response)}", status_code=status
            )
        try:
            body = msgspec.json.decode(response.content)
        except msgspec.DecodeError:
            raise ModelRequestError(
                f"{self.model} at {self._url}: response is not JSON "
                f"(content-type {response.headers.get('content-type', 'unknown')!r}): "
                f"{_one_line(response.text)!r}",
                status_code=status,
            ) from None
        try:
            return self._parse(body)
        except _Malformed as exc:
            raise ModelRequestError(
                f"{self.model} at {self._url}: malformed chat completion: {exc}", status_code=status
            ) from None

    def _parse(self, body: Any) -> ModelResponse:
        if not isinstance(body, dict):
            raise _Malformed(f"expected a JSON object, got {type(body).__name__}")
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _Malformed("no choices")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise _Malformed("the first choice has no message")
        raw = choice["message"]
        content = raw.get("content")
        if isinstance(content, list) and all(isinstance(part, dict) for part in content):
            content = tuple(content)  # content parts
        elif content is not None and not isinstance(content, str):
            raise _Malformed(f"message content is a {type(content).__name__}, not a string or parts")
        calls = raw.get("tool_calls") or []
        if not isinstance(calls, list):
            raise _Malformed("tool_calls is not a list")
        message = Message(
            role=str(raw.get("role") or "assistant"),
            content=content,
            tool_calls=tuple(_tool_call(call, i) for i, call in enumerate(calls)),
        )
        usage = _usage(body.get("usage"))
        finish = choice.get("finish_reason")
        model = body.get("model")
        return ModelResponse(
            message=message,
            model=model if isinstance(model, str) and model else self.model,
            usage=usage,
            finish_reason=finish if isinstance(finish, str) else None,
            cost=self._cost(usage),
        )

    def _cost(self, usage: Usage) -> float | None:
        if self.price_per_1k_input is None and self.price_per_1k_output is None:
            return None
        return (usage.prompt_tokens * (self.price_per_1k_input or 0.0)
                + usage.completion_tokens * (self.price_per_1k_output or 0.0)) / 1000

    def _transport_error(self, exc: Exception) -> CairnError:
        # a bad URL or a request httpx cannot even send is a configuration mistake, not an outage
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.InvalidURL):
            return ModelRequestError(f"{self.model} at {self._url}: cannot send request: {exc}")
        what = "timed out" if isinstance(exc, httpx.TimeoutException) else "unreachable"
        detail = _one_line(str(exc)) or type(exc).__name__
        return ModelUnavailable(f"{self.model} at {self._url}: {what}: {detail}")

    # -- HTTP clients ----------------------------------------------------------------------

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._sync is None:
                self._sync = httpx.Client(headers=self._headers, timeout=self.timeout)
            return self._sync

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async.get(loop)
            if client is None:
                client = httpx.AsyncClient(headers=self._headers, timeout=self.timeout)
                self._async[loop] = client
            return client

    def close(self) -> None:
        """Close the pooled connections. Call it when no run is using this
        client any more; a later call would simply open new ones.

        Async clients are closed on their own loop: at once if that loop is
        idle, by scheduling on it if it is running; clients of loops already
        closed are dropped (their connections went with the loop).
        """
        with self._lock:
            sync, self._sync = self._sync, None
            pending = list(self._async.items())
            self._async.clear()
        if sync is not None:
            sync.close()
        in_loop = _running_loop() is not None
        for loop, client in pending:
            if loop.is_closed():
                continue
            if loop.is_running() or in_loop:
                asyncio.run_coroutine_threadsafe(client.aclose(), loop)
            else:
                loop.run_until_complete(client.aclose())

    async def aclose(self) -> None:
        """``close`` for async code: awaits the current loop's client."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async.pop(loop, None)
        if client is not None:
            await client.aclose()
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _Malformed(Exception):
    """A response body that is JSON but not a usable chat completion."""


def _wire_message(message: Message) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, (tuple, list)):  # multimodal parts, as given
        wire["content"] = list(message.content)
    elif message.content is not None:
        wire["content"] = message.content
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        wire["name"] = message.name
    return wire


def _tool_call(raw: Any, index: int) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise _Malformed(f"tool call {index} has no function")
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed(f"tool call {index} has no function name")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        # some compatible servers send the arguments as an object instead of a JSON string
        arguments = msgspec.json.encode(arguments).decode()
    call_id = raw.get("id")
    # some local servers omit ids; a positional id is stable, and the response is journaled anyway
    return ToolCall(id=call_id if isinstance(call_id, str) and call_id else f"call_{index}", name=name,
                    arguments=arguments)


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()

    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    prompt, completion = count("prompt_tokens"), count("completion_tokens")
    return Usage(prompt, completion, count("total_tokens") or prompt + completion)


def _error_message(response: httpx.Response) -> str:
    """The server's own explanation, on one line: OpenAI-style
    ``{"error": {"message": ...}}`` when present, else the body's start."""
    try:
        body = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _one_line(error["message"]) or response.reason_phrase
        if isinstance(error, str):
            return _one_line(error) or response.reason_phrase
        if isinstance(body.get("message"), str):
            return _one_line(body["message"]) or response.reason_phrase
    return _one_line(response.text) or response.reason_phrase


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
