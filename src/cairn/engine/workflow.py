"""The object ``@app.workflow`` returns.

It lives in the engine (not beside ``App``) because ``ctx.child`` takes one:
the engine's ``Context`` must name it without importing the layer above.
"""

from __future__ import annotations

import functools
from typing import Any, Generic, TypeVar

from cairn.engine.definitions import WorkflowDef

R = TypeVar("R")


class Workflow(Generic[R]):
    """A registered workflow. Start it with ``app.start`` / ``app.run`` or, from
    another workflow, with ``ctx.child``; calling it directly would bypass the
    journal, so it is refused."""

    def __init__(self, definition: WorkflowDef) -> None:
        self.definition = definition
        functools.update_wrapper(self, definition.fn)

    @property
    def name(self) -> str:
        return self.definition.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"workflow {self.definition.name!r} cannot be called directly: use app.run(), app.start() "
            "or ctx.child()"
        )
