"""Patches: ship a compatible fix to runs already in flight.

``ctx.patched("fix-timeout")`` is true for a run that reaches it on the new
code and false for a run that passed that point before the code had it, so
one deploy can change behaviour for new progress while old journals still
replay exactly::

    if ctx.patched("fix-timeout"):
        fetch(url, timeout=30)      # new runs, and old runs not yet here
    else:
        fetch(url)                  # old runs replaying what they did

It is journaled: the first time a run reaches it live, a ``patch`` entry
records ``True`` at that position, and every replay returns it. A replay
that meets, at that position, an entry of some other call knows the run got
there before the patch existed: ``False``, and no position is taken, so the
rest of the old journal lines up as before. Once no run that needs the old
branch is left, replace the call with ``ctx.deprecate_patch("fix-timeout")``
(and drop the old branch): it consumes the marker of runs that recorded one
and records nothing for new runs. Remove it too once those runs are gone.
"""

from __future__ import annotations

from cairn.engine.execution import Execution

#: the ``step_kind`` of a patch marker in the journal
KIND = "patch"


def patched(execution: Execution, patch_id: str) -> bool:
    if not patch_id:
        raise ValueError("a patch needs a non-empty id")
    recorded = execution.peek()
    if recorded is not None and not _is_marker(recorded.step_kind, recorded.name, patch_id):
        return False  # this run passed here before the patch: the old branch, and no position
    call = execution.begin(KIND, patch_id)
    if call.recorded is not None:
        return bool(execution.replay(call, bool))
    return bool(execution.complete_call(call, True, bool))


def deprecate_patch(execution: Execution, patch_id: str) -> None:
    if not patch_id:
        raise ValueError("a patch needs a non-empty id")
    recorded = execution.peek()
    if recorded is not None and _is_marker(recorded.step_kind, recorded.name, patch_id):
        execution.replay(execution.begin(KIND, patch_id), bool)


def _is_marker(kind: str | None, name: str | None, patch_id: str) -> bool:
    return kind == KIND and name == patch_id
