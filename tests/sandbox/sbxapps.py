"""The workflow of the sandbox's crash test, registered on any App (in the
test process, or in a worker process: ``tests/sandbox/sbx_worker.py``).

``sbx-kill`` writes a file in a step, then runs a sandboxed command that
lists the workspace as it found it (``seen.txt``), writes ``partial.txt``,
sleeps in a process whose command line carries ``marker`` (so the test can
find it on the host) and writes ``done.txt``.
"""

from __future__ import annotations

import cairn
from cairn.sandbox import Limits, Policy
from cairn.sandbox.tool import sandbox_tool

DB_ENV = "CAIRN_TEST_DB"


def register(app: cairn.App) -> None:
    sandbox = sandbox_tool(app, policy=Policy(limits=Limits(wall_seconds=120)))

    @app.step
    def prepare() -> None:
        (cairn.step_info().workspace / "input.txt").write_text("before the command")

    @app.step
    def files() -> dict[str, str]:
        ws = cairn.step_info().workspace
        return {p.name: p.read_text() for p in sorted(ws.iterdir())}

    @app.workflow(name="sbx-kill")
    def kill(ctx: cairn.Context, marker: str) -> dict[str, object]:
        prepare()
        script = ("ls > seen.txt; echo partial > partial.txt; "
                  f"python3 -c 'import time; time.sleep(8)' {marker}; echo done > done.txt")
        result = sandbox(command=["sh", "-c", script], check=True)
        return {"exit_code": result["exit_code"], "files": files()}


def build(db: str, workspaces: str, lease_seconds: float = 1.0) -> cairn.App:
    app = cairn.App(db=db, lease_seconds=lease_seconds, workspaces=workspaces)
    register(app)
    return app
