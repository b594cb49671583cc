"""The sandbox as a Cairn tool: ``sandbox_tool(app)`` registers a tool that
runs a command (or Python code) in a sandbox whose ``/workspace`` is the
run's workspace (``op.workspace``).

Its effect on the run is its workspace changes, snapshotted with the
tool's result entry like any tool's (``engine.workspace``); so its declared
effect is ``idempotent``: a crash mid-command, or a failed attempt, leaves
at most unrecorded files, which the next attempt's start undoes (the
workspace is restored to the last recorded snapshot) before the command runs
again. A command that reaches the outside through egress has effects there
that are not undone: declare such a tool ``effect="write"`` (a crash then
asks an operator instead of running it again).
"""

from __future__ import annotations

from typing import Any

from cairn.api.app import App
from cairn.engine.tools import Effect, Operation
from cairn.errors import CairnError, InvalidArgument
from cairn.retry import RetryPolicy
from cairn.sandbox.policy import Policy
from cairn.sandbox.pool import Pool
from cairn.sandbox.runner import run, run_python


class SandboxFailed(CairnError):
    """A sandboxed command asked to ``check`` exited non-zero or timed out."""


def sandbox_tool(app: App, *, name: str = "sandbox", policy: Policy | None = None,
                 effect: Effect | str = Effect.IDEMPOTENT, retry: RetryPolicy | None = None,
                 pool: Pool | None = None) -> Any:
    """Register the sandbox tool on ``app``. Call it with ``command=[...]``
    or ``code="..."`` (Python), optionally ``stdin`` and ``check=True``
    (raise ``SandboxFailed`` unless it exits 0, so ``retry`` applies); it
    returns ``Result.as_dict()``. With ``pool``, commands run in its warm
    sandboxes (``cairn.sandbox.pool``): a run's first command is cold, the
    next ones of its workspace warm once the pool has refilled."""
    chosen = policy or Policy()
    launch, launch_python = (pool.run, pool.run_python) if pool is not None else (run, run_python)

    def sandbox(op: Operation, command: list[str] | None = None, code: str | None = None,
                stdin: str | None = None, check: bool = False) -> dict[str, Any]:
        if (command is None) == (code is None):
            raise InvalidArgument("the sandbox tool takes exactly one of command= and code=")
        given = stdin.encode() if stdin is not None else None
        ws = op.workspace
        result = (launch_python(code, ws, chosen, stdin=given) if code is not None
                  else launch(command or [], ws, chosen, stdin=given))
        if check and (result.exit_code != 0 or result.timed_out):
            why = "timed out" if result.timed_out else f"exited {result.exit_code}"
            raise SandboxFailed(f"sandboxed command {why}: {result.stderr.strip()[-500:]}")
        return result.as_dict()

    return app.tool(sandbox, effect=effect, name=name, retry=retry)


__all__ = ["SandboxFailed", "sandbox_tool"]
