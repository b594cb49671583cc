"""One body, two kinds: the same workflow, step, tool or reconciler built as
``def`` or as ``async def``, so every engine rule is tested on both paths.

A test takes the ``kind`` fixture (``sync`` / ``async``) and builds with it:

* ``kind.fn(body)`` is ``body`` itself, or an ``async def`` with the same
  signature and type hints that runs it: a step, a tool or a reconciler;
* ``kind.workflow(app, name)`` registers a workflow from a *generator* body
  in which every journaled call is yielded (``x = yield pay(42)``): a sync
  workflow gets the value at once, an async one awaits what the call
  returned; an exception of the call is raised at the ``yield`` either way;
* ``kind.model(ctx, client, messages)`` is ``ctx.model`` or ``ctx.model_async``;
  ``kind.scripted(policy)`` is a scripted model (with ``acomplete`` if async).

The engine sees a real sync workflow calling sync functions, or a real async
workflow awaiting async ones: nothing is mocked.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

import cairn
from cairn.models import Message, ModelRequest, ModelResponse, ScriptedModel

T = TypeVar("T")

#: A workflow body: yields each journaled call, returns the workflow's result.
Flow = Generator[Any, Any, T]

KINDS = ("sync", "async")


class AsyncScriptedModel(ScriptedModel):
    """A scripted model with a native ``acomplete``, as async clients have."""

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(0)
        return self.complete(request)


@dataclass(frozen=True, slots=True)
class Kind:
    name: str

    @property
    def is_async(self) -> bool:
        return self.name == "async"

    def fn(self, body: Callable[..., T]) -> Callable[..., Any]:
        """``body``, or an ``async def`` running it with the same signature."""
        if not self.is_async:
            return body

        @functools.wraps(body)
        async def run(*args: Any, **kwargs: Any) -> T:
            await asyncio.sleep(0)  # a real suspension point, like any async body
            return body(*args, **kwargs)

        return run

    def workflow(self, app: cairn.App, name: str) -> Callable[[Callable[..., Flow[Any]]], Any]:
        def register(body: Callable[..., Flow[Any]]) -> Any:
            hints = typing.get_type_hints(body)
            flow = hints.pop("return", None)
            result = typing.get_args(flow)[2] if flow is not None else Any
            if self.is_async:
                @functools.wraps(body)
                async def wf(ctx: cairn.Context, *args: Any, **kwargs: Any) -> Any:
                    return await _drive_async(body(ctx, *args, **kwargs))
            else:
                @functools.wraps(body)
                def wf(ctx: cairn.Context, *args: Any, **kwargs: Any) -> Any:
                    return _drive_sync(body(ctx, *args, **kwargs))
            wf.__annotations__ = {**hints, "return": result}
            return app.workflow(name=name)(wf)

        return register

    def model(self, ctx: cairn.Context, client: Any, messages: Sequence[Message], **params: Any) -> Any:
        if self.is_async:
            return ctx.model_async(client, messages, **params)
        return ctx.model(client, messages, **params)

    def scripted(self, policy: Any, model_id: str = "scripted-1") -> ScriptedModel:
        return (AsyncScriptedModel if self.is_async else ScriptedModel)(policy, model_id=model_id)


def _drive_sync(flow: Flow[T]) -> T:
    value: Any = None
    try:
        while True:
            value = flow.send(value)  # a sync call already returned its value
    except StopIteration as stop:
        result: T = stop.value
        return result


async def _drive_async(flow: Flow[T]) -> T:
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            pending = flow.throw(error) if error is not None else flow.send(value)
        except StopIteration as stop:
            result: T = stop.value
            return result
        error = None
        try:
            value = await pending if inspect.isawaitable(pending) else pending
        except Exception as exc:
            error = exc


#: Run a test once with sync and once with async workflows, tools and steps.
both = pytest.mark.parametrize("kind", [Kind(name) for name in KINDS], ids=KINDS)
