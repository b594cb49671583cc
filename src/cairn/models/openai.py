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

import asyncio
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

import msgspec

from cairn.errors import CairnError, MissingExtra
from cairn.models.base import FunctionCall, Message, ModelRequest, ModelResponse, ToolCall, Usage
from cairn.models.errors import (
    ModelRequestError,
    ModelUnavailable,
    error_code,
    error_message,
    one_line,
    retry_after,
)
from cairn.security import redaction
from cairn.security import secrets as security
from cairn.security.secrets import Secret, Secrets

try:
    import httpcore
    import httpx
except ImportError as exc:
    raise MissingExtra("cairn.models.openai", "openai") from exc

__all__ = ["DEFAULT_BASE_URL", "ModelRequestError", "ModelUnavailable", "OpenAIChat"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

class OpenAIChat:
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
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.model_id = model
        self.model = model
        raw_url = (
            base_url or os.environ.get("CAIRN_OPENAI_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
            or DEFAULT_BASE_URL
        )
        #: a reference resolved at each call (never a value kept here)
        self._key_ref = api_key if isinstance(api_key, Secret) else None
        self._secrets = secrets
        key: str | None = None
        if self._key_ref is None:
            key = (api_key if isinstance(api_key, str) else None) or os.environ.get("CAIRN_OPENAI_API_KEY") \
                or os.environ.get("OPENAI_API_KEY") or None
        self._url, shown, url_secrets = _endpoint(raw_url)
        header_secrets = [v for name, v in (extra_headers or {}).items() if _SECRET_PARAM.search(name)]
        self._redactor = _Redactor(*url_secrets, *header_secrets, key)
        #: the server's address as given, with its secrets masked: safe to print
        self.base_url = self._redact(shown)
        self._shown = self._redact(_shown(self._url)) if self._url.host else self.base_url
        self.timeout = timeout
        self.price_per_1k_input = price_per_1k_input
        self.price_per_1k_output = price_per_1k_output
        self._has_key = key is not None or self._key_ref is not None
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
        key = repr(self._key_ref) if self._key_ref is not None else "'***'" if self._has_key else "None"
        return f"OpenAIChat(model={self.model!r}, base_url={self.base_url!r}, api_key={key})"

    # -- calls -----------------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Send ``request`` and return the first choice of the answer."""
        body = self._body(request)
        _deadline.at = time.monotonic() + self.timeout
        try:
            response = self._sync_client().post(self._url, content=body, headers=self._auth())
            if response.status_code == 401 and self._key_ref is not None:  # expired: refresh, once
                response = self._sync_client().post(self._url, content=body, headers=self._auth(refresh=True))
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            # not chained: httpx's exception may carry the URL, credentials included
            raise self._transport_error(exc) from None
        finally:
            _deadline.at = None
        return self._response(response)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """``complete`` without blocking the event loop (``ctx.model_async`` uses it)."""
        body = self._body(request)
        try:
            async with asyncio.timeout(self.timeout):
                response = await self._async_client().post(self._url, content=body, headers=self._auth())
                if response.status_code == 401 and self._key_ref is not None:  # expired: refresh, once
                    response = await self._async_client().post(self._url, content=body,
                                                               headers=self._auth(refresh=True))
        except TimeoutError:
            raise self._unavailable(f"timed out after {self.timeout:g} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise self._transport_error(exc) from None
        return self._response(response)

    def _auth(self, *, refresh: bool = False) -> dict[str, str] | None:
        """The ``Authorization`` header of a key given as a ``Secret``,
        resolved now (``refresh``: a new value, the last one was refused)."""
        ref = self._key_ref
        if ref is None:
            return None
        value = security.refresh(ref, self._secrets) if refresh else security.resolve(ref, self._secrets)
        return {"Authorization": f"Bearer {value.reveal()}"}

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

    def _response(self, response: httpx.Response) -> ModelResponse:
        status = response.status_code
        if status == 429 and error_code(response) == "insufficient_quota":
            # an exhausted quota or billing limit does not lift by waiting
            raise self._rejected(f"HTTP {status}: {error_message(response)}", status)
        if status in (408, 429) or status >= 500:
            raise self._unavailable(f"HTTP {status}: {error_message(response)}", status,
                                    retry_after=retry_after(response.headers))
        if not 200 <= status < 300:
            raise self._rejected(f"HTTP {status}: {error_message(response)}", status)
        try:
            body = msgspec.json.decode(response.content)
        except msgspec.DecodeError:
            raise self._rejected(
                f"response is not JSON (content-type {response.headers.get('content-type', 'unknown')!r}): "
                f"{one_line(response.text)!r}", status,
            ) from None
        if isinstance(body, dict) and "error" in body and not body.get("choices"):
            # gateways (OpenRouter, LiteLLM...) report failures with a 200 and an
            # error body, whose numeric code says whether waiting can help
            detail = f"HTTP {status} with an error body: {error_message(response)}"
            error = body["error"]
            code = error.get("code") if isinstance(error, dict) else None
            if isinstance(code, int) and not isinstance(code, bool) and (code in (408, 429) or code >= 500):
                raise self._unavailable(detail, status, retry_after=retry_after(response.headers))
            raise self._rejected(detail, status)
        try:
            return self._parse(body)
        except _Malformed as exc:
            raise self._rejected(f"malformed chat completion: {exc}", status) from None

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
            refusal=_text(raw, "refusal"),
            function_call=_function_call(raw.get("function_call")),
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

    # -- errors: every message goes through _redact ---------------------------------------

    def _redact(self, text: str) -> str:
        return redaction.redact(self._redactor.redact(text))

    def _rejected(self, detail: str, status: int | None = None) -> ModelRequestError:
        return ModelRequestError(self._redact(f"{self.model} at {self._shown}: {detail}"), status_code=status)

    def _unavailable(self, detail: str, status: int | None = None, *,
                     retry_after: float | None = None) -> ModelUnavailable:
        return ModelUnavailable(self._redact(f"{self.model} at {self._shown}: {detail}"),
                                status_code=status, retry_after=retry_after)

    def _transport_error(self, exc: Exception) -> CairnError:
        # a bad URL or a request httpx cannot even send is a configuration mistake, not an outage
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.InvalidURL):
            return self._rejected(f"cannot send request: {one_line(str(exc))}")
        if isinstance(exc, httpx.TimeoutException):
            return self._unavailable(f"timed out after {self.timeout:g} s")
        return self._unavailable(f"unreachable: {one_line(str(exc)) or type(exc).__name__}")

    # -- HTTP clients ----------------------------------------------------------------------

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._sync is None:
                self._sync = httpx.Client(headers=self._headers, timeout=self.timeout,
                                          transport=_deadline_transport())
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


class _Redactor:
    """Masks this client's secrets in any text. It holds them but never shows
    them: its ``repr`` (in a debugger, ``vars()``, a log) names only a count."""

    __slots__ = ("_secrets",)

    #: shorter values are not masked inside messages: masking a 2-letter user
    #: name would garble every message, and such a value guards nothing
    MIN_LENGTH = 4

    def __init__(self, *secrets: str | None) -> None:
        # longest first, so a secret containing another is masked whole
        kept = {s for s in secrets if s and len(s) >= self.MIN_LENGTH}
        self._secrets = tuple(sorted(kept, key=len, reverse=True))

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def __repr__(self) -> str:
        return f"<{len(self._secrets)} secret(s) masked>"


class _Malformed(Exception):
    """A response body that is JSON but not a usable chat completion."""


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
        raise _Malformed(f"message {key} is a {type(value).__name__}, not a string")
    return value


def _function_call(raw: Any) -> FunctionCall | None:
    """The legacy ``function_call`` of a message (``functions=`` requests)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise _Malformed("function_call has no name")
    return FunctionCall(name=raw["name"], arguments=_arguments(raw.get("arguments")))


def _tool_call(raw: Any, index: int) -> ToolCall:
    if not isinstance(raw, dict):
        raise _Malformed(f"tool call {index} is not an object")
    call_id = raw.get("id")
    # some local servers omit ids; a positional id is stable, and the response is journaled anyway
    call_id = call_id if isinstance(call_id, str) and call_id else f"call_{index}"
    kind = raw.get("type") or "function"
    if kind == "custom":
        custom = raw.get("custom")
        if not isinstance(custom, dict) or not isinstance(custom.get("name"), str) or not custom["name"]:
            raise _Malformed(f"custom tool call {index} has no name")
        text = custom.get("input")
        if not isinstance(text, str):
            raise _Malformed(f"custom tool call {index} has no input")
        return ToolCall(id=call_id, name=custom["name"], arguments=text, type="custom")
    function = raw.get(kind) if isinstance(kind, str) else None
    if not isinstance(function, dict):
        raise _Malformed(f"tool call {index} has no {kind}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed(f"tool call {index} has no function name")
    return ToolCall(id=call_id, name=name, arguments=_arguments(function.get("arguments")), type=kind)


def _arguments(value: Any) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    # some compatible servers send the arguments as an object instead of a JSON string
    return msgspec.json.encode(value).decode()


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()

    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    prompt, completion = count("prompt_tokens"), count("completion_tokens")
    return Usage(prompt, completion, count("total_tokens") or prompt + completion)


#: query parameters whose values are credentials (Azure ``api-key``, SAS ``sig``, ``token``...)
_SECRET_PARAM = re.compile(r"key|token|secret|sig|pass|auth|cred", re.IGNORECASE)


def _endpoint(base_url: str) -> tuple[httpx.URL, str, list[str]]:
    """The chat-completions URL for ``base_url`` (its query string kept after
    the path), ``base_url`` for display, and the secrets it carries
    (user-info and secret-looking query values) to mask wherever shown."""
    text = base_url.strip()
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL:
        # left for the first call to report as a request error (nothing sent)
        return httpx.URL(), text.rstrip("/"), []
    secrets = [part for part in (url.username, url.password) if part]
    secrets += [value for name, value in url.params.multi_items() if value and _SECRET_PARAM.search(name)]
    endpoint = url.copy_with(path=url.path.rstrip("/") + "/chat/completions")
    return endpoint, _shown(url.copy_with(path=url.path.rstrip("/"))), secrets


def _shown(url: httpx.URL) -> str:
    """``url`` safe to print: user-info and secret query values become
    ``***`` (built, not substituted, so percent-encoding cannot hide them)."""
    params = [(name, "***" if value and _SECRET_PARAM.search(name) else value)
              for name, value in url.params.multi_items()]
    plain = url.copy_with(userinfo=b"", query=None)
    text = str(plain)
    if url.userinfo:
        text = text.replace("://", "://***@", 1)
    if params:
        text += "?" + "&".join(f"{name}={value}" for name, value in params)
    return text


class _Deadline(threading.local):
    """The monotonic time a sync call on this thread must end by (``None``:
    no call in progress). Every socket operation of the call is clamped to it."""

    at: float | None = None


_deadline = _Deadline()


def _remaining(timeout: float | None, error: type[Exception]) -> float | None:
    at = _deadline.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the call's total timeout is spent")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every read and write is clamped to the call's deadline:
    httpx's own timeouts apply per read, so a trickling server could hold a
    call for ever, one byte per (timeout - epsilon)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _remaining(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _remaining(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        left = _remaining(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, _remaining(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, _remaining(timeout, httpcore.ConnectTimeout),
                                                 socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _deadline_transport() -> httpx.HTTPTransport:
    """httpx's transport with its connection pool's sockets wrapped in
    ``_DeadlineStream``. httpx has no option for a network backend, so the
    pool's backend is swapped; tests/models pin that the swap takes effect
    (a trickling server is cut off at the call's timeout)."""
    transport = httpx.HTTPTransport()
    pool = transport._pool
    if not isinstance(pool, httpcore.ConnectionPool):  # pragma: no cover - httpx internals changed
        raise RuntimeError(f"cannot bound the call time: unexpected httpx pool {type(pool).__name__}")
    pool._network_backend = _DeadlineBackend(pool._network_backend)
    return transport


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
