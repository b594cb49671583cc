"""Control-flow signals raised through user workflow code.

They derive from ``BaseException`` so that a workflow's ``except Exception``
cannot swallow them: a suspension or an abandoned execution must reach the
executor no matter what the code in between does.

A bare ``except:`` or ``except BaseException`` still can. So a suspension is
told, as it is made, to the execution it suspends (``on_suspend``, which
``engine.execution`` sets): from then on that execution's every journaled
call, and its workflow returning, raises it again (``Execution.begin``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cairn.store.records import RunStatus


class Suspend(BaseException):
    """Park the run until ``wake_at``, until run ``waiting_on`` finishes,
    until a delivery for wait key ``waiting_for`` arrives (or ``wake_at``,
    its timeout), or (with none) until an operator acts. ``status`` is
    ``suspended`` or ``needs_attention``; ``detail`` goes into the history
    entry."""

    def __init__(
        self,
        reason: str,
        wake_at: float | None = None,
        waiting_on: str | None = None,
        *,
        waiting_for: str | None = None,
        status: RunStatus = RunStatus.SUSPENDED,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wake_at = wake_at
        self.waiting_on = waiting_on
        self.waiting_for = waiting_for
        self.status = status
        self.detail = detail
        if on_suspend is not None:
            on_suspend(self)


#: Called with every ``Suspend`` made (set by ``engine.execution``: it notes
#: the suspension on the execution of the context it is made in).
on_suspend: Callable[[Suspend], None] | None = None


class Release(BaseException):
    """Give the run back unfinished (the worker is draining)."""


class Abandon(BaseException):
    """The store failed under us: stop without writing more; the executor
    gives the run back once the store answers again (``executor.give_back``),
    and the next claim replays everything recorded so far."""


class Ended(BaseException):
    """The execution has ended (its main flow returned or stopped): a sibling
    task or thread may not start a journaled call any more. It ends that task
    or thread; what its run does next is decided by the next execution."""
