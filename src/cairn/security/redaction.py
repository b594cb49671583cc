"""The values this process has revealed, so that none of them is written down.

Every ``SecretValue`` registers its value here when it is made. Three things
use the registry:

* ``scan`` looks for a revealed value in bytes about to be recorded (every
  payload passes through ``PayloadCodec.wrap``): a body that returns the
  token it was given, or pastes it into a model message, is refused with
  ``SecretLeak`` naming the secret, instead of writing it into the journal;
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

Scanning costs nothing while no secret was revealed (one truth test), which
is every run that uses none.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections import OrderedDict

import msgspec

MIN_LENGTH = 8
CAPACITY = 256
MASK = "***"

_lock = threading.Lock()
#: value -> (secret name, the byte forms to look for)
_known: OrderedDict[str, tuple[str, tuple[bytes, ...]]] = OrderedDict()
#: the text forms to mask, longest first (a value containing another is masked whole)
_texts: tuple[str, ...] = ()
#: every (byte form, secret name) to look for, rebuilt on each change: a scan reads it without a lock
_forms: tuple[tuple[bytes, str], ...] = ()
_loggers_protected = False


def remember(value: str, name: str) -> None:
    """Register ``value`` (the value of secret ``name``) as revealed."""
    global _texts, _forms
    if len(value) < MIN_LENGTH:
        return
    with _lock:
        if value in _known:
            _known.move_to_end(value)
            return
        raw = value.encode()
        escaped = msgspec.json.encode(value)[1:-1]
        forms = {raw, escaped, base64.b64encode(raw), base64.urlsafe_b64encode(raw)}
        forms |= {form.rstrip(b"=") for form in list(forms)}
        _known[value] = (name, tuple(sorted(forms, key=len, reverse=True)))
        while len(_known) > CAPACITY:
            _known.popitem(last=False)
        texts = {v for v in _known} | {msgspec.json.encode(v)[1:-1].decode() for v in _known}
        _texts = tuple(sorted(texts, key=len, reverse=True))
        _forms = tuple((form, secret) for secret, forms_of in _known.values() for form in forms_of)
        first = not _loggers_protected
    if first:
        protect_loggers()


def active() -> bool:
    """Whether any value was revealed in this process (else nothing to look for)."""
    return bool(_forms)


def scan(data: bytes) -> str | None:
    """The name of a secret whose revealed value ``data`` holds, if any."""
    if len(data) < MIN_LENGTH:
        return None
    for form, name in _forms:
        if form in data:
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
    global _texts, _forms
    with _lock:
        _known.clear()
        _texts = ()
        _forms = ()


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


__all__ = ["MASK", "MIN_LENGTH", "RedactingFilter", "active", "protect_loggers", "redact", "remember", "scan"]
