"""The sandbox as a tool of a run, on SQLite and PostgreSQL: what the
command leaves in ``/workspace`` is the run's workspace, snapshotted with
the tool's result; a failed attempt's files are gone before the next
attempt runs the command again on the restored workspace; a symlink in the
workspace that points outside is never written through.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn import EventType
from cairn.engine.workspace import DETAIL_KEY
from cairn.sandbox import Limits, Policy
from cairn.sandbox.pool import Pool
from cairn.sandbox.tool import sandbox_tool
from tests.engine.conftest import postgres_url

pytestmark = pytest.mark.slow


@pytest.fixture(params=("sqlite", "postgres"))
def app(request: pytest.FixtureRequest, tmp_path: Path, ws: Path) -> Iterator[cairn.App]:
    db = (postgres_url(request.getfixturevalue("pg_url")) if request.param == "postgres"
          else f"sqlite:///{tmp_path}/cairn.db")
    app = cairn.App(db=db, workspaces=tmp_path / "workspaces")
    yield app
    app.close()


def test_the_commands_files_are_the_runs_workspace(app: cairn.App, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    sandbox = sandbox_tool(app, policy=Policy(limits=Limits(wall_seconds=60)),
                           retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0.01))

    @app.step
    def prepare() -> None:
        ws = cairn.step_info().workspace
        (ws / "input.txt").write_text("41")
        (ws / "escape").symlink_to(outside)

    @app.step
    def read_back() -> dict[str, str]:
        ws = cairn.step_info().workspace
        return {p.name: p.read_text() for p in sorted(ws.iterdir()) if p.is_file() and not p.is_symlink()}

    @app.workflow(name="sbx")
    def flow(ctx: cairn.Context) -> dict[str, object]:
        prepare()
        first = sandbox(code="n = int(open('input.txt').read())\nopen('output.txt', 'w').write(str(n + 1))\n"
                             "try:\n    open('escape', 'w').write('overwritten')\n"
                             "    print('wrote through')\n"
                             "except OSError as e:\n    print('refused', e.strerror)\n")
        # a failed attempt leaves garbage.txt and exits 3 (check=True: the call fails and is retried);
        # the next attempt must start from the recorded workspace, without it
        rerun = "if [ -e garbage.txt ]; then echo saw-garbage; exit 0; fi; echo > garbage.txt; exit 3"
        try:
            flaky: object = sandbox(command=["sh", "-c", rerun], check=True)
        except cairn.StepFailed as exc:
            flaky = f"failed: {exc}"
        return {"first": first, "flaky": flaky, "files": read_back()}

    result = app.run(flow, run_id="sbx-1")
    assert result["first"]["exit_code"] == 0, result
    assert "refused" in result["first"]["stdout"]
    assert outside.read_text() == "host file"
    assert result["files"]["output.txt"] == "42"
    # the snapshot recorded with the first call holds the command's file
    roots = [e.detail[DETAIL_KEY] for e in app.history("sbx-1")
             if e.event is EventType.STEP_COMPLETED and e.detail and DETAIL_KEY in e.detail]
    assert len(set(roots)) >= 2
    # both attempts ran the command on the restored workspace: neither saw the other's garbage
    assert isinstance(result["flaky"], str), result["flaky"]
    assert "exited 3" in result["flaky"], result["flaky"]
    assert "garbage.txt" not in result["files"]


def test_the_tool_runs_in_a_warm_sandbox_of_its_pool(tmp_path: Path, ws: Path) -> None:
    """With ``pool=``, a command of the run is handed to a sandbox launched
    ahead for the run's workspace (here by the step before it), and its
    files are the run's like a cold one's."""
    app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db", workspaces=tmp_path / "workspaces")
    pool = Pool(size=1, refill=False)
    sandbox = sandbox_tool(app, pool=pool)

    @app.step
    def ahead() -> None:
        ws = cairn.step_info().workspace
        (ws / "input.txt").write_text("41")
        pool.prepare(ws)

    @app.step
    def files() -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(cairn.step_info().workspace.iterdir())}

    @app.workflow(name="sbx-warm")
    def flow(ctx: cairn.Context) -> dict[str, object]:
        ahead()
        done = sandbox(command=["sh", "-c", "echo $(( $(cat input.txt) + 1 )) > output.txt"])
        return {"done": done, "files": files()}

    try:
        result = app.run(flow, run_id="sbx-warm-1")
    finally:
        pool.close()
        app.close()
    assert result["done"]["warm"] is True, (result, pool.last_failure)
    assert result["done"]["exit_code"] == 0, result
    assert result["files"] == {"input.txt": "41", "output.txt": "42\n"}
