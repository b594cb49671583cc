"""The canary test: secret values that must appear 0 times in anything Cairn
writes, on SQLite and PostgreSQL, with real ``cairn worker`` processes.

A run carries a reference to a canary token through its input (given as
JSON, as ``cairn start --input`` would), a read tool whose first attempt
fails with the token quoted in its error (a durable retry), a large result
stored as an artifact, a model call through ``OpenAIChat`` whose key is a
secret too (its first answer a 401: refreshed and sent again), a durable
timer, a worker SIGKILLed while a step holds the resolved token, a token
rotated while the run waits (the next worker resolves the new one), and a
``write`` tool that meets a revoked token (``CredentialExpired``: refreshed,
sent again under the same operation id). A second run fails for good with
its token in the error, logged by the worker; a third fails the same way
inline in this process, under ``caplog``.

Then every byte Cairn left behind is searched for every canary, in the forms
a value may take on the way (as is, JSON-escaped, base64 at each of the
three alignments, hex as PostgreSQL shows ``bytea``, UTF-16): the SQLite
database file, its WAL and shared-memory files, every artifact; on
PostgreSQL every row of every table of the schema, as text; the workers'
stderr; this process's log records; ``cairn show --json`` and ``cairn
events`` of each run. Zero occurrences, while the service and the model
server saw the tokens (so they were used, not merely absent).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg import sql

import cairn
from tests.acceptance.harness import REPO_ROOT, WorkerPool, WorkerProcess, read_effects, wait_until
from tests.backends import PostgresBackend, SqliteBackend, StoreBackend
from tests.models.fake_openai import FakeOpenAI, completion, error
from tests.security.canary_app import CONTROL_ENV, OPENAI_ENV, SECRETS_ENV, TOKEN, build_app

pytestmark = pytest.mark.slow


def forms(value: str) -> list[bytes]:
    """The byte strings that show ``value`` in a file, a row or a log."""
    raw = value.encode()
    found = {raw, json.dumps(value).encode()[1:-1], raw.hex().encode(), raw.hex().upper().encode(),
             value.encode("utf-16-le")}
    for shift in range(3):  # base64 of a longer buffer holding it at any offset
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b"\0" * shift + raw)
            found.add(text[4 if shift else 0:-4])
    return sorted(found)


def occurrences(data: bytes, canaries: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for label, value in canaries.items():
        n = sum(data.count(form) for form in forms(value))
        if n:
            counts[label] = n
    return counts


class CanaryWorkers(WorkerPool):
    """``cairn worker --app tests.security.canary_app:app`` processes."""

    def __init__(self, directory: Path, backend: StoreBackend, env: dict[str, str]) -> None:
        super().__init__(directory, backend)
        self.env = env

    def spawn(self, worker_id: str) -> WorkerProcess:
        args = ["--app", "tests.security.canary_app:app", "--db", self.backend.worker_url(worker_id),
                "--lease", "1", "--poll", "0.02", "--concurrency", "2", "--log-level", "DEBUG"]
        return self._launch("tests.security.cli_worker", worker_id, args, self.env)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "cairn", *args], cwd=REPO_ROOT, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return (done.stdout + done.stderr).decode(errors="replace")


def test_canary_secrets_appear_nowhere(
    tmp_path: Path, backend: StoreBackend, server: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    canaries = {name: f"CANARY-{name}-{secrets.token_hex(12)}" for name in ("A", "B", "C", "KEY")}
    vault, control = tmp_path / "secrets", tmp_path / "control"
    vault.mkdir()
    control.mkdir()
    (vault / "api-token").write_text(canaries["A"] + "\n")
    (vault / "openai-key").write_text(canaries["KEY"])
    (control / "valid-token").write_text(canaries["A"])
    server.script(error(401, "Incorrect API key provided"), completion("refund it"))
    env = {SECRETS_ENV: str(vault), CONTROL_ENV: str(control), OPENAI_ENV: server.url}
    workers = CanaryWorkers(tmp_path, backend, env)
    app = build_app(backend.url, vault, control, server.url)
    try:
        app.start_json("canary", {"token": {"$cairn": "secret", "name": "api-token", "provider": "vault"},
                                  "ticket": "T-42"}, run_id="canary")
        app.start("canary-fail", TOKEN, run_id="canary-fail")

        first = workers.spawn("w1")
        wait_until(lambda: (control / "holding").exists(), 60, workers.describe_workers)
        wait_until(lambda: app.get_run("canary-fail").status.terminal, 30, "canary-fail to fail")
        first.kill()  # while `hold` has the resolved token in its hands
        (control / "holding").unlink()
        (vault / "api-token").write_text(canaries["B"])  # rotated while nobody runs the run
        (control / "valid-token").write_text(canaries["B"])
        (control / "go").touch()

        second = workers.spawn("w2")
        wait_until(lambda: (control / "paused").exists(), 60, workers.describe_workers)
        # revoked behind the back of w2's vault cache, which holds B now
        (vault / "api-token").write_text(canaries["C"])
        (control / "valid-token").write_text(canaries["C"])
        (control / "go-pay").touch()
        wait_until(lambda: app.get_run("canary").status.terminal, 60, workers.describe_workers)

        # the inline run, in this process, under caplog
        with caplog.at_level(logging.DEBUG), pytest.raises(cairn.RunFailed, match=r"token=\*\*\*"):
            app.run("canary-fail", TOKEN, run_id="canary-inline")

        run = app.get_run("canary")
        assert run.status is cairn.RunStatus.COMPLETED, workers.describe_workers()
        result = app.handle("canary").result(timeout=5)
        assert result["token"] == {"$cairn": "secret", "name": "api-token", "provider": "vault"}
        paid = read_effects(control / "paid.jsonl")
        assert paid == [{"key": result["receipt"]["key"], "cents": 1250}]  # once, with the one key
        failed = app.get_run("canary-fail")
        assert failed.status is cairn.RunStatus.FAILED
        assert failed.error is not None
        assert "token=***" in failed.error["message"]
        # the secrets were used: the model server got the key (twice: 401, then again)
        assert [r.headers["authorization"] for r in server.requests] == [f"Bearer {canaries['KEY']}"] * 2
        history = app.history("canary")
        assert any(e.event is cairn.EventType.STEP_RETRIED for e in history)  # the failing attempt
        assert any(e.event is cairn.EventType.LEASE_TAKEN_OVER for e in history)  # the SIGKILL

        second.send(signal.SIGTERM)
        assert second.wait_exit(30) == 0
        logs = "".join(w.log_text() for w in workers.workers)
        assert "refreshed secret 'api-token' of provider 'vault'" in logs  # the write tool's refresh
        assert "(canary-fail) failed: StepFailed" in logs
        assert "token=***" in logs

        # -- what Cairn left behind ------------------------------------------------------
        found: dict[str, dict[str, int]] = {}
        if isinstance(backend, SqliteBackend):
            files = [p for p in backend.path.parent.iterdir()
                     if p.name.startswith(backend.path.name) and p.is_file()]
            artifacts = backend.path.with_name(backend.path.name + ".artifacts")
            stored = [p for p in artifacts.rglob("*") if p.is_file() and not p.name.startswith(".")]
            assert stored, "the large result should have been stored as an artifact"
            assert any(b"$cairn" in p.read_bytes() for p in stored)  # the reference is in one
            assert {p.name for p in files} >= {"cairn.db", "cairn.db-wal"}
            for path in files + stored:
                found[str(path.relative_to(tmp_path))] = occurrences(path.read_bytes(), canaries)
        else:
            assert isinstance(backend, PostgresBackend)
            with backend.connect() as conn:
                tables = [row[0] for row in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                    "AND table_type = 'BASE TABLE'", (backend.schema,))]
                assert {"runs", "history", "artifacts"} <= set(tables)
                rows = 0
                for table in tables:
                    query = sql.SQL("SELECT t::text FROM {} AS t").format(sql.Identifier(table))
                    text = "\n".join(row[0] for row in conn.execute(query))
                    rows += text.count("\n") + 1
                    found[f"table {table}"] = occurrences(text.encode(), canaries)
                artifact_rows = conn.execute("SELECT count(*) FROM artifacts").fetchone()
                assert artifact_rows is not None
                assert artifact_rows[0] >= 1
        for worker in workers.workers:
            found[worker.log_path.name] = occurrences(worker.log_path.read_bytes(), canaries)
        found["caplog"] = occurrences(caplog.text.encode(), canaries)
        for run_id in ("canary", "canary-fail", "canary-inline"):
            for command in (["show", run_id, "--json"], ["events", run_id]):
                output = cli(*command, "--db", backend.url)
                assert run_id in output or "run.created" in output  # it rendered the run
                found[" ".join(command)] = occurrences(output.encode(), canaries)
        leaks = {where: counts for where, counts in found.items() if counts}
        assert leaks == {}, leaks
        assert len(found) >= 8
    finally:
        app.close()
        workers.cleanup()
