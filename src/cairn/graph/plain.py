"""The state at a checkpoint as plain JSON, read without the graph's code.

The dashboard (and any reader that has no state type at hand: a server
that does not register the workflow, a run whose state type changed since)
shows what was *recorded*: every field decoded as plain JSON, with no
upcaster run and nothing validated. It needs no schema because a
checkpoint's ``versions`` say everything the reading needs: a field's
``[changed, base]`` names the checkpoint that set it whole (``base``) and,
when the two differ, that the field is a list that only grew since, by the
``add`` items of the checkpoints after ``base`` up to ``changed``
(``checkpoints.Chain.state`` reads the same records, typed).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

import msgspec

from cairn.errors import PayloadError

if TYPE_CHECKING:  # checkpoints reads an older version's state through this module
    from cairn.graph.checkpoints import Chain


def plain_state(chain: Chain, step: int, what: str) -> dict[str, Any]:
    """The state after super-step ``step`` of ``chain`` as plain JSON values
    (``PayloadError`` naming ``what`` and the field if a record cannot be read)."""
    record = chain.record(step)
    state: dict[str, Any] = {}
    for name, (changed, base) in record.versions.items():
        try:
            state[name] = _field(chain, name, changed, base)
        except (KeyError, msgspec.DecodeError, TypeError) as exc:
            raise PayloadError(f"cannot read field {name!r} of {what}: {type(exc).__name__}: {exc}") from None
    return state


def _field(chain: Chain, name: str, changed: int, base: int) -> Any:
    value = msgspec.json.decode(chain.record(base).set[name])
    if changed == base:
        return value
    if not isinstance(value, list):
        raise TypeError(f"appends follow a value that is not a list (a {type(value).__name__})")
    steps = chain.steps
    for later in steps[bisect.bisect_right(steps, base):bisect.bisect_right(steps, changed)]:
        raw = chain.record(later).add.get(name)
        if raw is not None:
            value.extend(msgspec.json.decode(raw))
    return value
