"""Per-run budgets: limits on model tokens, cost, tool calls and wall time.

Limits live on the run (``runs.budget``); usage is summed from the journal,
so tracking it adds no write to the hot path and survives every crash. A run
over budget is suspended with reason ``budget_exceeded`` before its next
model or tool call, and continues when an operator raises the limit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from cairn.engine.journal import Usage
from cairn.errors import InvalidArgument


def check_number(what: str, value: Any, *, integer: bool = False, infinite: bool = False,
                 negative: bool = False) -> None:
    """Refuse, with one ``InvalidArgument`` naming ``what``, a value that is
    no number a run can use: not an ``int`` (or, unless ``integer``, a
    ``float``; never a ``bool``), NaN (every comparison with it is false: a
    limit of NaN never triggers, a timeout of NaN never ends), an infinity
    unless ``infinite`` (it has no JSON form, so it cannot be recorded) or
    below zero unless ``negative``. The one rule for durations, timeouts and
    limits (``ctx.sleep``, ``timeout=``, ``Budget``, ``handle.result``)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise InvalidArgument(f"{what} must be {kind}, not {type(value).__name__} {value!r}")
    if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not infinite)):
        raise InvalidArgument(f"{what} must be a finite number, not {value!r}")
    if value < 0 and not negative:
        raise InvalidArgument(f"{what} must not be negative, not {value!r}")


@dataclass(frozen=True, slots=True)
class Budget:
    """Upper limits for one run; ``None`` means unlimited."""

    tokens: int | None = None
    cost: float | None = None
    tool_calls: int | None = None
    wall_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "tool_calls"):
            if getattr(self, name) is not None:
                check_number(f"the budget's {name}", getattr(self, name), integer=True)
        for name in ("cost", "wall_seconds"):
            if getattr(self, name) is not None:
                check_number(f"the budget's {name}", getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Budget | None:
        if not data:
            return None
        unknown = set(data) - {"tokens", "cost", "tool_calls", "wall_seconds"}
        if unknown:
            raise ValueError(f"unknown budget limits: {', '.join(sorted(unknown))}")
        return cls(**data)

    def exceeded(self, usage: Usage, elapsed: float, *, tool_call: bool) -> dict[str, Any] | None:
        """The first limit already reached, as an event detail; ``None`` if
        the next call may go ahead. ``tool_call`` says whether that call is a
        tool call (which would add one to ``tool_calls``)."""
        checks: list[tuple[str, float | None, float]] = [
            ("tokens", self.tokens, usage.tokens),
            ("cost", self.cost, usage.cost),
            ("wall_seconds", self.wall_seconds, elapsed),
        ]
        if tool_call:
            checks.append(("tool_calls", self.tool_calls, usage.tool_calls))
        for name, limit, used in checks:
            if limit is not None and used >= limit:
                return {"limit": name, "allowed": limit, "used": used}
        return None
