"""Importing a git repository as a run's starting workspace, on SQLite and
PostgreSQL (``App.start(..., workspace_from=..., workspace_ref=...)``).

The first body of the run finds exactly the tree of the ref (files with
git's two modes, symlinks as symlinks, nested and unicode names, never
``.git``), recorded before the first step; a directory that is not a
repository, or a ref it does not hold, is refused in one line before
anything is stored.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from cairn import EventType, RunStatus
from cairn.api.wsimport import IMPORT_NAME, IMPORT_POSITION, GitImportError
from cairn.engine.workspace import DETAIL_KEY
from cairn.security.keyring import LocalKeyring
from tests.engine.conftest import postgres_url
from tests.workspace.wsapps import root_of

pytestmark = pytest.mark.slow  # git processes

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


@pytest.fixture(params=("sqlite", "postgres"))
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return postgres_url(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path}/cairn.db"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout


def write_tree(at: Path, version: str) -> None:
    """The files of the repository's commit ``version``, and of the expected tree."""
    (at / "src" / "pkg").mkdir(parents=True, exist_ok=True)
    (at / "src" / "pkg" / "mod.py").write_text(f"VERSION = {version!r}\n")
    (at / "run.sh").write_text("#!/bin/sh\necho run\n")
    (at / "run.sh").chmod(0o755)
    (at / "ünïcødé 文件.txt").write_text("unicode")
    (at / "data.bin").write_bytes(bytes(range(256)) * 9000)  # > 1 MiB: a chunk list
    (at / "link").symlink_to("src/pkg/mod.py")
    (at / "passwd").symlink_to("/etc/passwd")


def normalize(at: Path) -> None:
    """git's modes: 0o755 for executables and directories, 0o644 for other files."""
    for dirpath, _, filenames in os.walk(at):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = Path(dirpath, name)
            if not path.is_symlink():
                path.chmod(0o755 if path.stat().st_mode & 0o100 else 0o644)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    write_tree(repo, "v1")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "v1")
    git(repo, "tag", "v1")
    (repo / "later.txt").write_text("only in v2")
    (repo / "src" / "pkg" / "mod.py").write_text("VERSION = 'v2'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "v2")
    (repo / "uncommitted.txt").write_text("never imported")
    return repo


def build(db: str, workspaces: Path, ring: LocalKeyring | None = None) -> cairn.App:
    app = cairn.App(db=db, lease_seconds=5.0, workspaces=workspaces, keyring=ring)

    @app.step
    def look() -> dict[str, object]:
        ws = cairn.step_info().workspace
        return {"root": root_of(ws), "files": sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))}

    @app.step
    def change() -> None:
        (cairn.step_info().workspace / "new.txt").write_text("new")

    @app.step
    def fail_once() -> None:
        ws = cairn.step_info().workspace
        marker = ws.parent / f"{ws.name}.failed"  # outside the workspace: survives the retry
        (ws / "src" / "pkg" / "mod.py").write_text("broken")
        if not marker.exists():
            marker.write_text("once")
            raise RuntimeError("fails once")

    @app.workflow(name="ws-git-retry")
    def retried(ctx: cairn.Context) -> dict[str, object]:
        change()
        fail_once()
        return look()

    @app.workflow(name="ws-git")
    def start(ctx: cairn.Context) -> dict[str, object]:
        first = look()
        change()
        return first

    return app


@pytest.fixture
def app(db: str, tmp_path: Path) -> Iterator[cairn.App]:
    application = build(db, tmp_path / "ws")
    yield application
    application.close()


def expected_root(tmp_path: Path, version: str) -> str:
    tree = tmp_path / f"expected-{version}"
    tree.mkdir()
    write_tree(tree, version)
    normalize(tree)
    return root_of(tree)


def test_a_run_starts_on_the_tree_of_the_ref(app: cairn.App, repo: Path, tmp_path: Path) -> None:
    handle = app.start("ws-git", run_id="g1", workspace_from=repo, workspace_ref="v1")
    app.worker(concurrency=1).run(max_idle=0.5)
    assert app.get_run("g1").status is RunStatus.COMPLETED
    seen = handle.result(timeout=10)
    assert seen["root"] == expected_root(tmp_path, "v1")
    files = seen["files"]
    assert isinstance(files, list)
    assert "later.txt" not in files
    assert "uncommitted.txt" not in files
    assert not any(f == ".git" or f.startswith(".git/") for f in files)
    history = app.history("g1")
    imported = [e for e in history if e.name == IMPORT_NAME]
    assert len(imported) == 1
    assert imported[0].position == IMPORT_POSITION
    assert imported[0].detail is not None
    assert imported[0].detail[DETAIL_KEY] == seen["root"]
    first_step = next(e for e in history if e.event is EventType.STEP_COMPLETED and e.name != IMPORT_NAME)
    assert imported[0].seq < first_step.seq  # recorded before the first step
    shots = app.operator.workspaces.snapshots("g1")
    assert len(shots) == 3
    assert shots[0].root == seen["root"]
    assert shots[0].position == IMPORT_POSITION
    restored = tmp_path / "restored"
    app.operator.workspaces.restore("g1", IMPORT_POSITION, restored)
    assert root_of(restored) == seen["root"]
    assert os.readlink(restored / "passwd") == "/etc/passwd"
    # the collector reaches the imported tree (its root is recorded like any snapshot's): nothing goes
    assert app.operator.workspaces.collect("default", grace_seconds=0)[0].deleted == 0
    again = tmp_path / "again"
    app.operator.workspaces.restore("g1", IMPORT_POSITION, again)
    assert root_of(again) == seen["root"]


def test_an_operator_retry_starts_again_from_the_imported_tree(app: cairn.App, repo: Path,
                                                              tmp_path: Path) -> None:
    handle = app.start("ws-git-retry", run_id="g4", workspace_from=repo, workspace_ref="v1")
    app.worker(concurrency=1).run(max_idle=0.5)
    assert app.get_run("g4").status is RunStatus.FAILED
    app.retry("g4")  # voids the journal from position 0 on: the import, at -1, stays
    app.worker(concurrency=1).run(max_idle=0.5)
    tree = tmp_path / "expected-retry"
    tree.mkdir()
    write_tree(tree, "v1")
    (tree / "new.txt").write_text("new")
    (tree / "src" / "pkg" / "mod.py").write_text("broken")
    normalize(tree)
    assert handle.result(timeout=10)["root"] == root_of(tree)


def test_the_default_ref_is_head(app: cairn.App, repo: Path, tmp_path: Path) -> None:
    handle = app.start("ws-git", run_id="g2", workspace_from=repo)
    app.worker(concurrency=1).run(max_idle=0.5)
    tree = tmp_path / "expected-head"
    tree.mkdir()
    write_tree(tree, "v2")
    (tree / "later.txt").write_text("only in v2")
    normalize(tree)
    assert handle.result(timeout=10)["root"] == root_of(tree)


def _stored_objects(app: cairn.App) -> int:
    return len(app.store.workspace_candidates("default", float("inf"), "", 100000))


@pytest.mark.parametrize("case", ["not-a-dir", "not-a-repo", "inside-a-repo", "unknown-ref", "option-ref",
                                  "a-tree-not-a-commit"])
def test_bad_input_is_one_line_and_stores_nothing(app: cairn.App, repo: Path, tmp_path: Path,
                                                  case: str) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    path, ref, words = {"not-a-dir": (tmp_path / "missing", "HEAD", "not a directory"),
                        "not-a-repo": (plain, "HEAD", "not a git repository"),
                        "inside-a-repo": (repo / "src", "HEAD", "not the top of a git repository"),
                        "a-tree-not-a-commit": (repo, "HEAD^{tree}", "unknown ref 'HEAD^{tree}'"),
                        "unknown-ref": (repo, "no-such-tag", "unknown ref 'no-such-tag'"),
                        "option-ref": (repo, "--output=/tmp/x", "is not a ref")}[case]
    with pytest.raises(GitImportError) as refused:
        app.start("ws-git", run_id="bad", workspace_from=path, workspace_ref=ref)
    message = str(refused.value)
    assert words in message
    assert "\n" not in message
    assert app.store.get_run("bad") is None
    assert _stored_objects(app) == 0


def test_an_import_under_encryption_reads_back(db: str, repo: Path, tmp_path: Path) -> None:
    app = build(db, tmp_path / "ws", LocalKeyring({"k": os.urandom(32)}, "k"))
    try:
        handle = app.start("ws-git", run_id="g3", workspace_from=repo, workspace_ref="v1")
        app.worker(concurrency=1).run(max_idle=0.5)
        assert handle.result(timeout=10)["root"] == expected_root(tmp_path, "v1")
    finally:
        app.close()


def test_the_cli_refuses_bad_input_in_one_line_and_imports_good(db: str, repo: Path, tmp_path: Path) -> None:
    from tests.cli.test_cli import APP, check_error, cli

    plain = tmp_path / "plain"
    plain.mkdir()
    args = ("start", "greet", "--app", APP, "--db", db, "--input", '{"name": "ada"}', "--run-id", "c1")
    check_error(cli(*args, "--workspace-from", str(plain)), 1, "not a git repository")
    check_error(cli(*args, "--workspace-from", str(repo), "--workspace-ref", "nope"), 1, "unknown ref 'nope'")
    check_error(cli(*args, "--workspace-ref", "v1"), 2, "--workspace-ref only applies with --workspace-from")
    reader = cairn.App(db=db)
    try:
        assert reader.store.get_run("c1") is None
        done = cli(*args, "--workspace-from", str(repo), "--workspace-ref", "v1")
        assert done.exit_code == 0, done.stderr
        shots = reader.operator.workspaces.snapshots("c1")
        assert [s.root for s in shots] == [expected_root(tmp_path, "v1")]
    finally:
        reader.close()


def test_a_bare_repository_imports_the_same_tree(app: cairn.App, repo: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], env=GIT_ENV, check=True)
    handle = app.start("ws-git", run_id="g5", workspace_from=bare, workspace_ref="v1")
    app.worker(concurrency=1).run(max_idle=0.5)
    assert handle.result(timeout=10)["root"] == expected_root(tmp_path, "v1")
