"""Retry policies, re-exported for the engine's callers.

The policy and the error classification live in ``cairn.retry``, below both
the engine and the model adapters (which classify provider errors with
``TerminalError`` and must not import the engine).
"""

from cairn.retry import NO_RETRY, RetryableError, RetryPolicy, TerminalError

__all__ = ["NO_RETRY", "RetryPolicy", "RetryableError", "TerminalError"]
