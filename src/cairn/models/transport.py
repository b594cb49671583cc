"""What every HTTP model adapter shares: the connection pools, the whole-call
timeout, the API key kept out of sight, and the redaction of every message.

``HTTPModel`` is the base of ``cairn.models.openai.OpenAIChat`` and
``cairn.models.anthropic.AnthropicChat``: each adds only its wire format
(the body it sends, ``_parse`` of an answer, and two hooks for what only
its provider says: ``_status_error`` and ``_body_error``). How a status
maps to the error taxonomy and how a body that is not JSON is reported is
``_response``'s, here, once. Keeping the
transport in one place means a fix to the timeout, the secret handling or
the pooling reaches both providers. Needs httpx (the ``openai`` and
``anthropic`` extras); the adapters import it only after checking for httpx,
so a missing extra is reported with the adapter's own name.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

import msgspec

from cairn.errors import CairnError, MissingExtra
from cairn.models.base import Message, ModelResponse, Usage
from cairn.models.errors import ModelRequestError, ModelUnavailable, error_message, one_line, retry_after
from cairn.security import redaction
from cairn.security import secrets as security
from cairn.security.secrets import Secret, Secrets

try:
    import httpcore
    import httpx
except ImportError as exc:  # the adapters check first, naming their own extra; this is for a direct import
    raise MissingExtra("cairn.models.transport", "openai") from exc

__all__ = ["SECRET_PARAM", "HTTPModel", "Malformed", "Redactor", "endpoint", "shown", "token_counts"]

#: statuses a later attempt may get past (with 5xx): a timeout, a rate limit
RETRYABLE_STATUSES = frozenset({408, 429})


class Malformed(Exception):
    """A response body that is JSON but not a usable answer (``_parse``)."""


class HTTPModel:
    """A model behind one HTTPS endpoint, called with a JSON POST.

    ``url`` is the full endpoint; ``shown`` its printable form and
    ``url_secrets`` the credentials it carries (``endpoint`` gives all
    three). The key is either a value (kept only inside the pooled clients'
    headers, under ``key_header``) or a ``Secret`` reference resolved on
    every call, refreshed once on a 401. ``timeout`` bounds the whole call.
    """

    def __init__(
        self,
        model: str,
        *,
        url: httpx.URL,
        shown_url: str,
        url_secrets: Iterable[str],
        key: str | None,
        key_ref: Secret | None,
        key_header: tuple[str, str],
        timeout: float,
        headers: dict[str, str],
        extra_headers: dict[str, str] | None,
        secrets: Secrets | None,
    ) -> None:
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.model_id = model
        self.model = model
        #: a reference resolved at each call (never a value kept here)
        self._key_ref = key_ref
        self._secrets = secrets
        #: (header name, value format with ``{key}``)
        self._key_header = key_header
        self._url = url
        header_secrets = [v for name, v in (extra_headers or {}).items() if SECRET_PARAM.search(name)]
        self._redactor = Redactor(*url_secrets, *header_secrets, key)
        #: the server's address as given, with its secrets masked: safe to print
        self.base_url = self._redact(shown_url)
        self._shown = self._redact(shown(self._url)) if self._url.host else self.base_url
        self.timeout = timeout
        self._has_key = key is not None or key_ref is not None
        # the key is kept only inside the headers: no attribute, repr or error message shows it
        self._headers = {**headers, **(extra_headers or {})}
        if key is not None:
            self._headers[key_header[0]] = key_header[1].format(key=key)
        self._lock = threading.Lock()
        self._sync: httpx.Client | None = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def _key_repr(self) -> str:
        return repr(self._key_ref) if self._key_ref is not None else "'***'" if self._has_key else "None"

    # -- one POST ------------------------------------------------------------------------

    def _post(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST ``body`` (with ``headers`` of this request), within the call's
        timeout; a 401 with a ``Secret`` key refreshes it and sends once
        more (a refused request did nothing)."""
        _deadline.at = time.monotonic() + self.timeout
        try:
            response = self._sync_client().post(self._url, content=body, headers=self._auth(headers=headers))
            if response.status_code == 401 and self._key_ref is not None:  # expired: refresh, once
                response = self._sync_client().post(self._url, content=body,
                                                    headers=self._auth(refresh=True, headers=headers))
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            # not chained: httpx's exception may carry the URL, credentials included
            raise self._transport_error(exc) from None
        finally:
            _deadline.at = None
        return response

    async def _apost(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        """``_post`` without blocking the event loop."""
        try:
            async with asyncio.timeout(self.timeout):
                response = await self._async_client().post(self._url, content=body,
                                                           headers=self._auth(headers=headers))
                if response.status_code == 401 and self._key_ref is not None:  # expired: refresh, once
                    response = await self._async_client().post(
                        self._url, content=body, headers=self._auth(refresh=True, headers=headers))
        except TimeoutError:
            raise self._unavailable(f"timed out after {self.timeout:g} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise self._transport_error(exc) from None
        return response

    def _auth(self, *, refresh: bool = False, headers: dict[str, str] | None = None) -> dict[str, str] | None:
        """This request's own ``headers`` plus the key header of a key given
        as a ``Secret``, resolved now (``refresh``: a new value, the last one
        was refused)."""
        ref = self._key_ref
        if ref is None:
            return headers
        value = security.refresh(ref, self._secrets) if refresh else security.resolve(ref, self._secrets)
        name, template = self._key_header
        return {**(headers or {}), name: template.format(key=value.reveal())}

    # -- an answer: the taxonomy once, the provider's format by hooks ---------------------

    #: what a body ``_parse`` refuses is called in the error ("chat completion", "message")
    answer_name = "answer"

    def _response(self, response: httpx.Response) -> ModelResponse:
        """The parsed answer, or the error it is: the provider's own reading
        of the status first (``_status_error``), then 408, 429 and 5xx are
        ``ModelUnavailable`` (with ``Retry-After``), any other non-2xx a
        ``ModelRequestError``; a body that is not JSON is refused naming its
        content type; an error inside a 2xx body is the provider's to judge
        (``_body_error``); what ``_parse`` finds malformed is refused."""
        status = response.status_code
        own = self._status_error(response)
        if own is not None:
            raise own
        if status in RETRYABLE_STATUSES or status >= 500:
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
        in_body = self._body_error(body, response)
        if in_body is not None:
            raise in_body
        try:
            return self._parse(body)
        except Malformed as exc:
            raise self._rejected(f"malformed {self.answer_name}: {exc}", status) from None

    def _status_error(self, response: httpx.Response) -> CairnError | None:
        """The provider's error for a status it reads otherwise than the
        common rule (``None``: the rule applies)."""
        return None

    def _body_error(self, body: Any, response: httpx.Response) -> CairnError | None:
        """The error reported inside a 2xx JSON body, as the provider or a
        gateway in front of it writes one (``None``: an answer)."""
        return None

    def _parse(self, body: Any) -> ModelResponse:
        """The answer in ``body`` (decoded JSON); ``Malformed`` if it is not one."""
        raise NotImplementedError

    def _cost(self, usage: Usage) -> float | None:
        """What ``usage`` cost at the adapter's prices (``None``: none set)."""
        raise NotImplementedError

    def _answer(self, message: Message, body: dict[str, Any], finish: Any, usage: Usage,
                provider: dict[str, Any] | None = None) -> ModelResponse:
        """The response holding ``message``: the model the server names in
        ``body`` (this adapter's own if it names none: a gateway may not),
        ``finish`` if it is a string (anything else the server sends is not a
        reason), ``usage`` and what it cost."""
        model = body.get("model")
        return ModelResponse(message=message, model=model if isinstance(model, str) and model else self.model,
                             usage=usage, finish_reason=finish if isinstance(finish, str) else None,
                             cost=self._cost(usage), provider=provider)

    def _in_body(self, response: httpx.Response, retryable: bool) -> CairnError:
        """An error found in a 2xx body: unavailable if waiting may help."""
        status = response.status_code
        detail = f"HTTP {status} with an error body: {error_message(response)}"
        if retryable:
            return self._unavailable(detail, status, retry_after=retry_after(response.headers))
        return self._rejected(detail, status)

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


class Redactor:
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


#: query parameters whose values are credentials (Azure ``api-key``, SAS ``sig``, ``token``...)
SECRET_PARAM = re.compile(r"key|token|secret|sig|pass|auth|cred", re.IGNORECASE)


def token_counts(raw: Any, *keys: str) -> list[int]:
    """The counts ``keys`` of a usage object as a provider sent it, each 0
    where it is missing or not a non-negative integer, all 0 where ``raw``
    is not an object: a malformed count must not fail a call that
    otherwise answered, nor reach a budget as a negative or a bool."""
    if not isinstance(raw, dict):
        return [0] * len(keys)
    return [value if isinstance(value := raw.get(key), int) and not isinstance(value, bool) and value >= 0
            else 0 for key in keys]


def endpoint(base_url: str, suffix: str) -> tuple[httpx.URL, str, list[str]]:
    """The URL of ``base_url`` + ``suffix`` (its query string kept after
    the path), ``base_url`` for display, and the secrets it carries
    (user-info and secret-looking query values) to mask wherever shown."""
    text = base_url.strip()
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL:
        # left for the first call to report as a request error (nothing sent)
        return httpx.URL(), text.rstrip("/"), []
    secrets = [part for part in (url.username, url.password) if part]
    secrets += [value for name, value in url.params.multi_items() if value and SECRET_PARAM.search(name)]
    full = url.copy_with(path=url.path.rstrip("/") + suffix)
    return full, shown(url.copy_with(path=url.path.rstrip("/"))), secrets


def shown(url: httpx.URL) -> str:
    """``url`` safe to print: user-info and secret query values become
    ``***`` (built, not substituted, so percent-encoding cannot hide them)."""
    params = [(name, "***" if value and SECRET_PARAM.search(name) else value)
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
