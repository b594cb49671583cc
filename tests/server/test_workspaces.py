"""``/api/runs/{run_id}/workspace``: a run's workspace snapshots over HTTP,
on both backends: the snapshots, a snapshot's files (a symlink shown as its
target, never followed), the diff of two; another tenant's run is 404 as
an unknown one; bad positions one JSON error."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import cairn
from cairn.workspace.local import Workspaces

from .conftest import TENANT, Setup


@pytest.fixture
def ws_run(setup: Setup, tmp_path: Path) -> str:
    app = setup.app
    app.runtime.workspaces = Workspaces(tmp_path / "workspaces")

    @app.step
    def write(name: str) -> None:
        (cairn.step_info().workspace / name).write_text(name)

    @app.step
    def link() -> None:
        (cairn.step_info().workspace / "passwd").symlink_to("/etc/passwd")

    @app.workflow(name="ws-http")
    def flow(ctx: cairn.Context) -> None:
        write("a.txt")
        write("b.txt")
        link()

    app.run(flow, run_id="w", tenant=TENANT)
    return "w"


def test_snapshots_files_and_diff(setup: Setup, client: httpx.Client, ws_run: str) -> None:
    viewer = setup.headers("viewer")
    shots = client.get(f"/api/runs/{ws_run}/workspace", headers=viewer).json()["snapshots"]
    assert [(s["position"], s["name"]) for s in shots] == [(0, "write"), (1, "write"), (2, "link")]
    latest = client.get(f"/api/runs/{ws_run}/workspace/latest", headers=viewer).json()
    files = {f["path"]: f for f in latest["files"]}
    assert files["passwd"] == {"path": "passwd", "kind": "symlink", "mode": "0o777", "size": 11,
                               "target": "/etc/passwd"}
    assert set(files) == {"a.txt", "b.txt", "passwd"}
    first = client.get(f"/api/runs/{ws_run}/workspace/0", headers=viewer).json()
    assert [f["path"] for f in first["files"]] == ["a.txt"]
    changes = client.get(f"/api/runs/{ws_run}/workspace/0/diff/latest", headers=viewer).json()["changes"]
    assert sorted((c["path"], c["change"]) for c in changes) == [("b.txt", "added"), ("passwd", "added")]


def test_another_tenant_sees_nothing(setup: Setup, client: httpx.Client, ws_run: str) -> None:
    intruder = setup.headers("other-admin")
    for path in ("", "/latest", "/0/diff/1"):
        response = client.get(f"/api/runs/{ws_run}/workspace{path}", headers=intruder)
        assert response.status_code == 404, response.text


@pytest.mark.parametrize(("path", "status"), [
    ("/7", 404), ("/-1", 400), ("/x", 400), ("/%D9%A1", 400), ("/latest/diff/0", 400), ("/0/diff/9", 404),
])
def test_bad_positions(setup: Setup, client: httpx.Client, ws_run: str, path: str, status: int) -> None:
    response = client.get(f"/api/runs/{ws_run}/workspace{path}", headers=setup.headers("viewer"))
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error", "message"}
