"""The values this process has revealed, so that none of them is written down.

Every ``SecretValue`` registers its value here when it is made. Three things
use what is registered:

* ``scan`` looks for a revealed value in bytes about to be recorded (every
  payload passes through ``PayloadCodec.wrap``; a model request is scanned
  before it is sent): a body that returns the token it was given, or pastes
  it into a model message, is refused with ``SecretLeak`` naming the secret,
  instead of writing it into the journal;
* ``redact`` masks revealed values in text that Cairn writes (the message of
  a recorded error: an HTTP library's exception that echoes an
  ``Authorization`` header);
* ``RedactingFilter`` does the same for the log records of Cairn's loggers,
  tracebacks included.

A value is looked for in the forms a payload or a message may carry it in:
as is, JSON-escaped, and base64 (standard and URL-safe), since ``bytes`` are
written as base64. Values shorter than ``MIN_LENGTH`` characters are not
looked for: they would match by accident (and refuse an innocent result)
and guard next to nothing. The registry keeps the ``CAPACITY`` most recent
values: a long-lived worker that refreshes a token every hour does not grow
without bound (an old, expired token dropping out of it is harmless).

Scans are scoped to an execution. The engine opens a ``scope`` for each
claim it executes, and every value resolved or revealed while it runs is
noted in it (``note``); a payload recorded inside the scope is searched for
those values only, typically one or two, so a worker that revealed hundreds
of tokens over a week pays for none of them on the runs that use none.
Outside any scope (an input given to ``app.start``) every registered value
is searched for. Masking (``redact``) always uses the whole registry: it
runs only on errors and log lines.
"""

from __future__ import annotations

import base64
import contextvars
import logging
import threading
from collections import OrderedDict

import msgspec

MIN_LENGTH = 8
CAPACITY = 256
MASK = "***"

Forms = tuple[tuple[bytes, str], ...]

_lock = threading.Lock()
#: value -> (secret name, the byte forms to look for)
_known: OrderedDict[str, tuple[str, tuple[bytes, ...]]] = OrderedDict()
#: the text forms to mask, longest first (a value containing another is masked whole)
_texts: tuple[str, ...] = ()
#: every (byte form, secret name) of the registry, rebuilt on each change: read without a lock
_forms: Forms = ()
#: the same forms by their first ``MIN_LENGTH`` bytes (every form is at least that long)
_by_prefix: dict[bytes, Forms] = {}
#: Up to this many forms a scan searches for each in turn (``bytes`` search is
#: fast, but each one is a call); past it, a payload up to ``_PREFIX_SCAN_MAX``
#: bytes is walked once, looking each position's prefix up, so the cost stops
#: growing with the number of values (only outside an execution's scope).
_SEARCH_FORMS = 24
_PREFIX_SCAN_MAX = 16 * 1024
_loggers_protected = False


class Scope:
    """The values revealed to one execution (see the module docstring)."""

    __slots__ = ("forms", "values")

    def __init__(self) -> None:
        self.values: set[str] = set()
        self.forms: Forms = ()

    def add(self, value: str, name: str, forms: tuple[bytes, ...]) -> None:
        with _lock:
            if value not in self.values:
                self.values.add(value)
                self.forms = self.forms + tuple((form, name) for form in forms)


_SCOPE: contextvars.ContextVar[Scope] = contextvars.ContextVar("cairn_revealed")


def open_scope() -> contextvars.Token[Scope]:
    """Start noting the values revealed in this context (one execution)."""
    return _SCOPE.set(Scope())


def close_scope(token: contextvars.Token[Scope]) -> None:
    _SCOPE.reset(token)


def _forms_of(value: str) -> tuple[bytes, ...]:
    raw = value.encode()
    escaped = msgspec.json.encode(value)[1:-1]
    forms = {raw, escaped, base64.b64encode(raw), base64.urlsafe_b64encode(raw)}
    forms |= {form.rstrip(b"=") for form in list(forms)}
    return tuple(sorted(forms, key=len, reverse=True))


def remember(value: str, name: str) -> None:
    """Register ``value`` (the value of secret ``name``) as revealed, and
    note it in the current execution's scope."""
    global _texts, _forms, _by_prefix
    if len(value) < MIN_LENGTH:
        return
    with _lock:
        known = _known.get(value)
        if known is not None:
            _known.move_to_end(value)
            forms = known[1]
        else:
            forms = _forms_of(value)
            _known[value] = (name, forms)
            while len(_known) > CAPACITY:
                _known.popitem(last=False)
            texts = set(_known) | {msgspec.json.encode(v)[1:-1].decode() for v in _known}
            _texts = tuple(sorted(texts, key=len, reverse=True))
            _forms = tuple((form, secret) for secret, forms_of in _known.values() for form in forms_of)
            by_prefix: dict[bytes, list[tuple[bytes, str]]] = {}
            for form, secret in _forms:
                by_prefix.setdefault(form[:MIN_LENGTH], []).append((form, secret))
            _by_prefix = {prefix: tuple(entries) for prefix, entries in by_prefix.items()}
        first = not _loggers_protected
    note(value, name, forms)
    if first:
        protect_loggers()


def note(value: str, name: str, forms: tuple[bytes, ...] | None = None) -> None:
    """``value`` is being used in the current execution: look for it in what
    the execution records (a cached value, made in an earlier execution, is
    noted again by each execution that resolves or reveals it)."""
    scope = _SCOPE.get(None)
    if scope is None or value in scope.values or len(value) < MIN_LENGTH:
        return
    if forms is None:
        known = _known.get(value)
        forms = known[1] if known is not None else _forms_of(value)
    scope.add(value, name, forms)


def active() -> bool:
    """Whether there is anything to look for here (else a scan is skipped)."""
    scope = _SCOPE.get(None)
    return bool(scope.forms) if scope is not None else bool(_forms)


def scan(data: bytes) -> str | None:
    """The name of a secret whose revealed value ``data`` holds, if any."""
    scope = _SCOPE.get(None)
    forms = scope.forms if scope is not None else _forms
    if len(data) < MIN_LENGTH or not forms:
        return None
    if scope is not None or len(forms) <= _SEARCH_FORMS or len(data) > _PREFIX_SCAN_MAX:
        for form, name in forms:
            if form in data:
                return name
        return None
    lookup = _by_prefix.get
    for i in range(len(data) - MIN_LENGTH + 1):
        candidates = lookup(data[i:i + MIN_LENGTH])
        if candidates is not None:
            for form, name in candidates:
                if data.startswith(form, i):
                    return name
    return None


def redact(text: str) -> str:
    """``text`` with every revealed value masked as ``***``."""
    texts = _texts
    if not texts:
        return text
    for value in texts:
        if value in text:
            text = text.replace(value, MASK)
    return text


def forget_all() -> None:
    """Empty the registry (for tests that need a process with nothing revealed)."""
    global _texts, _forms, _by_prefix
    with _lock:
        _known.clear()
        _texts = ()
        _forms = ()
        _by_prefix = {}


class RedactingFilter(logging.Filter):
    """Masks revealed values in a log record: its message (arguments
    applied) and its traceback. A logger's filters see only the records
    logged on that very logger, so ``protect_loggers`` puts one on each of
    Cairn's loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _texts:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler to report
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info:
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            record.exc_text, record.exc_info = redact(text), None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = RedactingFilter()


def protect_loggers(prefix: str = "cairn") -> None:
    """Put the redacting filter on the logger ``prefix`` and on every logger
    under it that exists now (idempotent). ``App`` calls it, and so does the
    first value revealed in the process."""
    global _loggers_protected
    names = [prefix] + [name for name in list(logging.root.manager.loggerDict)
                        if name.startswith(prefix + ".")]
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    _loggers_protected = True


__all__ = [
    "MASK",
    "MIN_LENGTH",
    "RedactingFilter",
    "Scope",
    "active",
    "close_scope",
    "note",
    "open_scope",
    "protect_loggers",
    "redact",
    "remember",
    "scan",
]
