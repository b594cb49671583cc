"""``cairn show`` and ``cairn events`` show each model call exactly as it was
sent, although the journal stores every message only once per run."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from cairn.models import Message, ModelRequest
from cairn.models.scripted import ScriptedModel


def _chat(db: str) -> tuple[str, list[list[dict[str, str]]]]:
    """A three-turn chat; returns the run id and each request's messages."""
    app = cairn.App(db=db)
    model = ScriptedModel(lambda request, n: Message(role="assistant", content=f"answer {n} " + "x" * 300))
    sent: list[list[dict[str, str]]] = []

    @app.workflow(name="chat")
    def chat(ctx: cairn.Context) -> int:
        messages = [Message(role="system", content="be brief <b>[bold]</b>")]
        for turn in range(3):
            messages.append(Message(role="user", content=f"question {turn} " + "y" * 300))
            reply = ctx.model(model, messages, temperature=0.5)
            messages.append(reply.message)
        return len(messages)

    original = model.complete

    def recording(request: ModelRequest) -> cairn.models.ModelResponse:
        sent.append([{"role": m.role, "content": m.content or ""} for m in request.messages])
        return original(request)

    model.complete = recording  # type: ignore[method-assign]
    handle = app.start(chat)
    app.resume(handle.run_id)
    app.close()
    return handle.run_id, sent


def _messages(value: dict[str, object]) -> list[dict[str, str]]:
    request = value["request"]
    assert isinstance(request, dict)
    return [{"role": m["role"], "content": m["content"] or ""} for m in request["messages"]]


def test_show_json_rebuilds_every_request(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    run_id, sent = _chat(db)
    out = CliRunner().invoke(main, ["show", run_id, "--json", "--db", db])
    assert out.exit_code == 0, out.output
    journal = json.loads(out.stdout)["journal"]
    models = [entry for entry in journal if entry["kind"] == "model"]
    assert [len(_messages(m["result"])) for m in models] == [2, 4, 6]
    assert [_messages(m["result"]) for m in models] == sent
    assert models[2]["result"]["request"]["params"] == {"temperature": 0.5}


def test_events_rebuild_requests_even_when_read_from_the_middle(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    run_id, sent = _chat(db)
    app = cairn.App(db=db)
    model_seqs = [e.seq for e in app.history(run_id) if e.step_kind == "model"]
    app.close()
    after = model_seqs[-1] - 1  # only the last model call is in the stream
    out = CliRunner().invoke(main, ["events", run_id, "--json", "--after", str(after), "--db", db])
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    model_lines = [line for line in lines if line.get("kind") == "model"]
    assert len(model_lines) == 1
    assert _messages(model_lines[0]["result"]) == sent[2]
