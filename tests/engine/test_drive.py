"""The sans-IO driver: what reaches a protocol and what passes it by, the
same under ``run_sync`` and ``run_async``."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import Any

import pytest

from cairn.engine.drive import Invoke, Protocol, run_async, run_sync
from cairn.errors import ToolTimeout

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who")


class Stop(BaseException):
    """Stands for ``Suspend`` / ``LeaseLost``: never handled by a protocol."""


def drive(kind: str, protocol: Protocol[Any]) -> Any:
    if kind == "sync":
        return run_sync(protocol)
    return asyncio.run(run_async(protocol))


def as_kind(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if kind == "sync":
        return fn

    async def run(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0)
        return fn(*args, **kwargs)

    return run


def recording(log: list[str], requests: list[Invoke]) -> Protocol[list[Any]]:
    """Sends each request, records what came back (value or exception)."""
    results: list[Any] = []
    try:
        for request in requests:
            try:
                results.append((yield request))
            except Exception as exc:
                results.append(f"{type(exc).__name__}: {exc}")
        return results
    finally:
        log.append("closed")


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


@KINDS
def test_values_and_exceptions_come_back_to_the_protocol(kind: str) -> None:
    def fail() -> None:
        raise ValueError("no")

    log: list[str] = []
    requests = [Invoke(as_kind(kind, lambda x: x + 1), (1,)), Invoke(as_kind(kind, fail))]
    assert drive(kind, recording(log, requests)) == [2, "ValueError: no"]
    assert log == ["closed"]


@KINDS
def test_a_base_exception_passes_by_and_closes_the_protocol_at_once(kind: str) -> None:
    def stop() -> None:
        raise Stop

    log: list[str] = []
    with pytest.raises(Stop):
        drive(kind, recording(log, [Invoke(as_kind(kind, stop)), Invoke(lambda: log.append("ran"))]))
    assert log == ["closed"]  # the protocol's finally ran before the exception arrived here


@KINDS
def test_a_timeout_is_thrown_into_the_protocol(kind: str) -> None:
    def slow_sync() -> str:
        time.sleep(0.5)
        return "late"

    async def slow_async() -> str:
        await asyncio.sleep(0.5)
        return "late"

    slow = slow_sync if kind == "sync" else slow_async
    log: list[str] = []
    results = drive(kind, recording(log, [Invoke(slow, (), None, 0.05, "tool 'slow'")]))
    assert results == ["ToolTimeout: tool 'slow' did not return within 0.05s"]
    assert issubclass(ToolTimeout, Exception)


def test_a_sync_call_with_a_timeout_runs_in_a_thread_that_sees_the_context() -> None:
    token = WHO.set("step 3")
    try:
        assert run_sync(recording([], [Invoke(WHO.get, (), None, 1.0)])) == ["step 3"]
    finally:
        WHO.reset(token)


def test_an_awaitable_in_a_sync_call_is_a_misuse_not_a_failure() -> None:
    async def reconcile() -> str:
        return "done"

    log: list[str] = []
    with pytest.raises(TypeError, match="reconcile of tool 'pay' is async"):
        run_sync(recording(log, [Invoke(reconcile, (), None, None, "reconcile of tool 'pay'")]))
    assert log == ["closed"]  # raised past the protocol: nothing it could have recorded
