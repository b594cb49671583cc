"""The workflows of the workspace tests, registered on any App (in the test
process, or in a worker process: ``tests/workspace/ws_worker.py``).

Steps write into ``cairn.step_info().workspace`` and return the root id of
the directory as they found it (hashed from scratch, no cache), so a test
compares what a body saw with what the journal recorded before it.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import cairn
from cairn.workspace import TreeCache, snapshot

#: where ``slow_write`` announces it is writing (a file the test waits for)
MARKER_ENV = "CAIRN_TEST_WS_MARKER"
#: the database and the workspaces directory of a worker process
DB_ENV = "CAIRN_TEST_DB"


def root_of(path: Path) -> str:
    """The root id of ``path``, every file hashed (no cache)."""
    return snapshot(path, TreeCache(), None).root


def populate(ws: Path) -> None:
    """Every kind of thing a snapshot keeps."""
    (ws / "src").mkdir(exist_ok=True)
    (ws / "src" / "main.py").write_text("print('hi')\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "private.txt").write_text("mine")
    (ws / "private.txt").chmod(0o600)
    (ws / "empty-dir").mkdir(exist_ok=True)
    (ws / "large.bin").write_bytes(os.urandom((1 << 20) * 2 + 777))
    (ws / "zeros.bin").write_bytes(bytes(5000))
    (ws / "ünïcødé 文件 🐍.txt").write_text("unicode")
    (ws / "passwd").symlink_to("/etc/passwd")
    (ws / "up").symlink_to("../../outside")


def register(app: cairn.App) -> None:
    @app.step
    def fill() -> str:
        ws = cairn.step_info().workspace
        before = root_of(ws)
        populate(ws)
        return before

    @app.step(retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0.01))
    def flaky(path: str) -> str:
        ws = Path(path)  # the path the workflow handed over: the body never asks for it
        before = root_of(ws)
        if cairn.step_info().attempt == 1:  # a failed attempt's writes must not survive it
            (ws / "half-written.txt").write_text("garbage")
            (ws / "src" / "main.py").write_text("corrupted")
            (ws / "run.sh").chmod(0o600)
            raise RuntimeError("flaky")
        (ws / "second.txt").write_text("from the second attempt")
        return before

    @app.step
    def look() -> str:
        return root_of(cairn.step_info().workspace)

    @app.step
    def look_at(path: str) -> str:
        return root_of(Path(path))

    @app.step
    def fails(path: str) -> None:
        (Path(path) / "garbage.txt").write_text("left by a failed step")
        raise RuntimeError("no retry")

    @app.workflow(name="ws-catch")
    def catch(ctx: cairn.Context) -> dict[str, str]:
        path = str(ctx.workspace)
        first = fill()
        with contextlib.suppress(cairn.StepFailed):
            fails(path)
        return {"fill": first, "after": look_at(path)}

    @app.step
    def slow_write() -> str:
        ws = cairn.step_info().workspace
        before = root_of(ws)
        marker = os.environ.get(MARKER_ENV)
        with (ws / "big-output.bin").open("wb") as out:
            (ws / "src" / "main.py").unlink()
            (ws / "src" / "new.py").write_text("half done")
            for i in range(400):
                out.write(os.urandom(64 << 10))
                out.flush()
                if i == 5 and marker and not Path(marker).exists():
                    Path(marker).write_text(str(os.getpid()))
                if marker and Path(marker).exists() and Path(marker).read_text() == str(os.getpid()):
                    time.sleep(0.05)  # the first worker is killed in here
        return before

    @app.tool(effect="idempotent")
    def tool_writes(op: cairn.Operation, name: str) -> str:
        ws = op.workspace
        before = root_of(ws)
        (ws / name).write_text(op.operation_id)
        return before

    @app.workflow(name="ws-handoff")
    def handoff(ctx: cairn.Context) -> dict[str, str]:
        path = str(ctx.workspace)
        first = fill()
        ctx.wait_for_signal("go")
        return {"fill": first, "flaky": flaky(path), "look": look(), "tool": tool_writes("by-tool.txt"),
                "after": look()}

    @app.workflow(name="ws-kill")
    def kill(ctx: cairn.Context) -> dict[str, str]:
        fill()
        return {"slow": slow_write(), "after": look()}


class Plan(TypedDict):
    """The state of ``ws-branches``: what each parallel node does, and what
    the nodes saw (``seen``: node -> the root of its directory as it found it)."""

    edits: dict[str, Any]
    seen: Annotated[list[list[str]], cairn.append]


def register_branches(app: cairn.App) -> None:
    """``ws-branches``: ``setup`` writes a base tree; ``left`` and ``right``
    run side by side, each editing the workspace as ``edits[node]`` says
    (``writes``: path -> text, ``removes``, ``delay`` before writing,
    ``hang``: stop mid-write until killed, once per marker file); ``join``
    looks at the merged tree."""

    @app.step
    def edit(writes: dict[str, str], removes: list[str], delay: float, hang: bool) -> str:
        ws = cairn.step_info().workspace
        before = root_of(ws)
        time.sleep(delay)
        for rel, text in writes.items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(text)
        for rel in removes:
            target = ws / rel
            if target.is_dir():
                for child in sorted(target.rglob("*"), reverse=True):
                    child.unlink() if not child.is_dir() else child.rmdir()
                target.rmdir()
            else:
                target.unlink()
        marker = os.environ.get(MARKER_ENV)
        if hang and marker and not Path(marker).exists():
            (ws / "half-written.bin").write_bytes(os.urandom(1 << 16))
            Path(marker).write_text(str(os.getpid()))
            time.sleep(120)  # the worker is SIGKILLed in here
        return before

    def node(name: str) -> Any:
        def run(state: Plan) -> dict[str, Any]:
            spec = state["edits"].get(name, {})
            before = edit(spec.get("writes", {}), spec.get("removes", []), spec.get("delay", 0.0),
                          spec.get("hang", False))
            return {"seen": [[name, before]]}
        return run

    g = cairn.Graph(Plan)
    for name in ("setup", "left", "right", "join"):
        g.node(node(name), name=name)
    g.edge(cairn.START, "setup")
    g.edge("setup", "left")
    g.edge("setup", "right")
    g.edge("left", "join")
    g.edge("right", "join")
    g.edge("join", cairn.END)
    app.graph("ws-branches", g)


def build(db: str, workspaces: str | Path, lease_seconds: float = 1.0) -> cairn.App:
    app = cairn.App(db=db, lease_seconds=lease_seconds, workspaces=workspaces)
    register(app)
    register_branches(app)
    return app
