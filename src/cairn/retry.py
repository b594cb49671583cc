"""Retry policies and the classification of step errors.

This module sits at the bottom of the layers (beside ``errors``): the engine
applies policies, and model adapters classify provider errors as terminal,
without either importing the other.

A failed attempt is classified *retryable* or *terminal*. Retryable failures
are retried after an exponential backoff with jitter; the wait is a durable
timer (the run suspends and frees its worker), not a sleep.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from cairn.errors import InvalidArgument


class TerminalError(Exception):
    """Raise from a step to fail it at once, whatever its retry policy says."""


class RetryableError(Exception):
    """Raise from a step to ask for a retry even if the policy's ``retry_on``
    would not match (attempts are still limited by ``max_attempts``)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry a failing step.

    ``max_attempts`` counts the first attempt: 1 means never retry. The n-th
    retry waits ``initial_delay * backoff**(n-1)`` seconds, capped at
    ``max_delay``, then spread by up to ``±jitter`` (a fraction) so that many
    runs failing together do not retry in lockstep.
    """

    max_attempts: int = 3
    initial_delay: float = 1.0
    backoff: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    no_retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidArgument(f"max_attempts must be an integer of at least 1, not {self.max_attempts!r}")
        # each must be a finite number: a NaN passes every check written as a comparison that fails
        for name, low, high in (("initial_delay", 0.0, math.inf), ("max_delay", 0.0, math.inf),
                                ("backoff", 1.0, math.inf), ("jitter", 0.0, 1.0)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                    or not low <= value <= high):
                bound = f"in [{low:g}, {high:g}]" if high < math.inf else f">= {low:g}"
                raise InvalidArgument(f"RetryPolicy's {name} must be a finite number {bound}, not {value!r}")

    def retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` may be retried at all (ignoring the attempt count)."""
        if isinstance(exc, TerminalError):
            return False
        if isinstance(exc, RetryableError):
            return True
        if self.no_retry_on and isinstance(exc, self.no_retry_on):
            return False
        return isinstance(exc, self.retry_on)

    def delay(self, failed_attempt: int, exc: BaseException | None = None) -> float:
        """Seconds to wait after attempt number ``failed_attempt`` (1-based)
        failed with ``exc``. When ``exc`` carries the server's own hint (a
        ``retry_after`` in seconds, as ``ModelUnavailable`` does from an HTTP
        ``Retry-After``), that is the wait: retrying sooner would be refused
        again. It is capped by ``max_delay``, so a hostile hint cannot park a
        run for ever."""
        hint = getattr(exc, "retry_after", None)
        if isinstance(hint, int | float) and not isinstance(hint, bool) and math.isfinite(hint) and hint >= 0:
            return min(self.max_delay, float(hint))
        base = min(self.max_delay, self.initial_delay * self.backoff ** (failed_attempt - 1))
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))


#: Steps do not retry unless asked to: retrying a side effect must be a choice.
NO_RETRY = RetryPolicy(max_attempts=1)
