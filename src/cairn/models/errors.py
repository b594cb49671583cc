"""Model errors and the reading of an HTTP error answer, with no optional dependency.

``ModelUnavailable`` and ``ModelRequestError`` are raised by every model and
embedder client (``cairn.models.openai``, ``cairn.memory.embedders``) and
named in retry policies, so they live here rather than in the OpenAI
adapter: that module needs httpx (the ``openai`` extra), and importing it to
get an exception class made ``import cairn`` fail on a plain install. The
helpers read an OpenAI-style error answer; they take any object shaped like
an ``httpx.Response`` (only clients that have httpx call them).
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from cairn.errors import CairnError
from cairn.retry import TerminalError

if TYPE_CHECKING:
    import httpx

__all__ = ["ModelRequestError", "ModelUnavailable", "error_code", "error_message", "one_line", "retry_after"]

#: Longest server error message kept in an exception: enough to diagnose,
#: short enough that an HTML error page does not flood the journal and the CLI.
MAX_MESSAGE = 300


class ModelUnavailable(CairnError):
    """The model server could not answer now: rate limited (429), failing
    (5xx), unreachable or too slow. Retrying later may succeed.

    ``retry_after`` is the server's hint in seconds (``Retry-After`` as
    seconds or an HTTP date, or ``retry-after-ms``); a ``RetryPolicy`` waits
    exactly that long before the next attempt (``cairn.retry``), capped by its
    ``max_delay``.
    """

    def __init__(self, message: str, *, status_code: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after


class ModelRequestError(TerminalError, CairnError):
    """The server refused the request (4xx other than 429; a 429 for an
    exhausted quota, ``insufficient_quota``), or answered with something that
    is not a chat completion, or the request cannot be sent as asked
    (``stream=True``). Sending the same request again
    would fail the same way, so it is a ``TerminalError``: never retried,
    whatever the call's retry policy says.

    ``status_code`` is the HTTP status (``None`` when the request never got
    an HTTP answer, e.g. an unsupported URL scheme).
    """

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code



def _error_body(response: httpx.Response) -> Any:
    try:
        return msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        return None


def error_code(response: httpx.Response) -> str | None:
    """OpenAI's ``error.code`` (or ``error.type``), e.g. ``insufficient_quota``."""
    body = _error_body(response)
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    if "insufficient_quota" in (error.get("code"), error.get("type")):
        return "insufficient_quota"
    code = error.get("code")
    return code if isinstance(code, str) else None


def error_message(response: httpx.Response) -> str:
    """The server's own explanation, on one line: OpenAI-style
    ``{"error": {"message": ...}}`` when present, else the body's start."""
    body = _error_body(response)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return one_line(error["message"]) or response.reason_phrase
        if isinstance(error, str):
            return one_line(error) or response.reason_phrase
        if isinstance(body.get("message"), str):
            return one_line(body["message"]) or response.reason_phrase
    return one_line(response.text) or response.reason_phrase


def one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def retry_after(headers: httpx.Headers) -> float | None:
    """The server's wait hint in seconds: ``retry-after-ms`` (OpenAI), else
    ``Retry-After`` as seconds or as an HTTP date; ``None`` if absent or
    unreadable."""
    seconds: float | None = None
    try:
        if "retry-after-ms" in headers:
            seconds = float(headers["retry-after-ms"]) / 1000
        elif "retry-after" in headers:
            seconds = float(headers["retry-after"])
    except ValueError:
        seconds = _seconds_until(headers.get("retry-after", ""))
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _seconds_until(http_date: str) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()
