"""``cairn workspace ls|diff|restore|export`` on both backends: what a run's
snapshots hold, their diff, an exact checkout, a git export with one
commit per snapshot; bad input is one line, exit 1, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from tests.backends import StoreBackend
from tests.cli.test_cli import check_error, cli
from tests.workspace.test_run_workspace import roots
from tests.workspace.wsapps import root_of


@pytest.fixture
def app(backend: StoreBackend, tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=backend.url, workspaces=tmp_path / "workspaces")

    @application.step
    def write(name: str, text: str) -> None:
        ws = cairn.step_info().workspace
        (ws / "notes").mkdir(exist_ok=True)
        (ws / "notes" / name).write_text(text)

    @application.step
    def remove(name: str) -> None:
        (cairn.step_info().workspace / "notes" / name).unlink()

    @application.step
    def link() -> None:
        ws = cairn.step_info().workspace
        (ws / "passwd").symlink_to("/etc/passwd")
        (ws / "tool.sh").write_text("#!/bin/sh\n")
        (ws / "tool.sh").chmod(0o755)
        (ws / "line\nerror: forged.txt").write_text("hostile name")

    @application.workflow(name="notes")
    def notes(ctx: cairn.Context) -> None:
        write("a.txt", "one")
        write("b.txt", "two")
        remove("a.txt")
        link()

    application.run(notes, run_id="w1")
    yield application
    application.close()


def test_ls_snapshots_and_files(app: cairn.App, backend: StoreBackend) -> None:
    shots = json.loads(cli("workspace", "ls", "w1", "--snapshots", "--json", "--db", backend.url).stdout)
    assert [(s["position"], s["name"]) for s in shots] == [(0, "write"), (1, "write"), (2, "remove"),
                                                           (3, "link")]
    result = cli("workspace", "ls", "w1", "1", "--json", "--db", backend.url)
    assert result.exit_code == 0, result.stderr
    files = {f["path"]: f for f in json.loads(result.stdout)["files"]}
    assert set(files) == {"notes", "notes/a.txt", "notes/b.txt"}
    latest = cli("workspace", "ls", "w1", "--db", backend.url)
    assert latest.exit_code == 0, latest.stderr
    assert any(line.endswith("passwd -> /etc/passwd") for line in latest.stdout.splitlines())
    assert len(latest.stdout.splitlines()) == 5  # the newline in a name forges no line
    assert "line\\x0aerror: forged.txt" in latest.stdout


def test_diff(app: cairn.App, backend: StoreBackend) -> None:
    result = cli("workspace", "diff", "w1", "0", "3", "--db", backend.url)
    assert result.exit_code == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted([
        "D  notes/a.txt", "A  notes/b.txt", "A  passwd", "A  tool.sh", "A  line\\x0aerror: forged.txt"])
    single = json.loads(cli("workspace", "diff", "w1", "2", "--json", "--db", backend.url).stdout)
    assert [(c["path"], c["change"]) for c in single["changes"]] == [("notes/a.txt", "removed")]


def test_restore_is_exact_and_refuses_a_non_empty_directory(app: cairn.App, backend: StoreBackend,
                                                            tmp_path: Path) -> None:
    dest = tmp_path / "checkout"
    result = cli("workspace", "restore", "w1", "1", "--to", str(dest), "--db", backend.url)
    assert result.exit_code == 0, result.stderr
    assert root_of(dest) == roots(app, "w1")["write#2"]
    (dest / "mine.txt").write_text("keep me")
    check_error(cli("workspace", "restore", "w1", "--to", str(dest), "--db", backend.url), 1, "not empty")
    assert (dest / "mine.txt").read_text() == "keep me"
    forced = cli("workspace", "restore", "w1", "--to", str(dest), "--force", "--db", backend.url)
    assert forced.exit_code == 0, forced.stderr
    assert root_of(dest) == roots(app, "w1")["link"]
    assert os.readlink(dest / "passwd") == "/etc/passwd"


@pytest.mark.slow  # runs git
def test_export_as_git(app: cairn.App, backend: StoreBackend, tmp_path: Path) -> None:
    dest = tmp_path / "repo"
    result = cli("workspace", "export", "w1", "--to", str(dest), "--json", "--db", backend.url)
    assert result.exit_code == 0, result.stderr
    commits = json.loads(result.stdout)["commits"]
    assert len(commits) == 4
    log = subprocess.run(["git", "-C", str(dest), "log", "--format=%H %s", "--reverse"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert [line.split()[0] for line in log] == [c["commit"] for c in commits]
    files = subprocess.run(["git", "-C", str(dest), "ls-tree", "-r", "HEAD"], capture_output=True, text=True,
                           check=True).stdout
    assert "120000 blob" in files  # a symlink, as git keeps one
    assert "100755 blob" in files  # an executable
    assert os.readlink(dest / "passwd") == "/etc/passwd"
    assert not (dest / "notes" / "a.txt").exists()
    first = subprocess.run(["git", "-C", str(dest), "show", f"{commits[0]['commit']}:notes/a.txt"],
                           capture_output=True, text=True, check=True).stdout
    assert first == "one"


@pytest.mark.parametrize(("args", "fragment"), [
    (("ls", "nope"), "nope"),
    (("ls", "w1", "9"), "no workspace snapshot at position 9"),
    (("diff", "w1", "7", "3"), "position 7"),
])
def test_bad_input_is_one_line(app: cairn.App, backend: StoreBackend, args: tuple[str, ...],
                               fragment: str) -> None:
    check_error(cli("workspace", *args, "--db", backend.url), 1, fragment)


def test_gc_keeps_every_recorded_snapshot_and_refuses_a_bad_grace(app: cairn.App, backend: StoreBackend,
                                                                  tmp_path: Path) -> None:
    result = cli("workspace", "gc", "--grace", "0s", "--json", "--db", backend.url)
    assert result.exit_code == 0, result.stderr
    (done,) = json.loads(result.stdout)["tenants"]
    assert (done["tenant"], done["roots"], done["deleted"]) == ("default", 4, 0)
    assert done["examined"] == done["reachable"] > 0
    dest = tmp_path / "checkout"
    assert cli("workspace", "restore", "w1", "0", "--to", str(dest), "--db", backend.url).exit_code == 0
    assert root_of(dest) == roots(app, "w1")["write"]
    check_error(cli("workspace", "gc", "--grace", "soon", "--db", backend.url), 2, "'--grace'")
