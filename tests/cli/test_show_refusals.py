"""``cairn show`` says what a run was started with and shows a tool call
refused for its role: who tried what is read from the journal alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main


def test_show_names_the_started_role_and_the_refusal(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    app = cairn.App(db=db)

    @app.tool(effect="write", access=cairn.ToolAccess(role="admin"))
    def wipe(what: str) -> str:
        return f"wiped {what}"

    @app.workflow(name="wiper")
    def wiper(ctx: cairn.Context) -> str:
        return wipe("everything")

    with pytest.raises(cairn.RunFailed):
        app.run(wiper, run_id="low", started_role="viewer", started_token="tok-viewer")
    app.close()
    out = CliRunner().invoke(main, ["show", "low", "--db", db], terminal_width=200)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "thread - started as viewer (token tok-viewer) queue" in text  # a row of the head
    assert "ToolRefused" in text
    assert "a run started as viewer (token tok-viewer) may not call it: it needs admin" in text
