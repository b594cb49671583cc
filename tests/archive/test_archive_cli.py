"""``cairn archive`` in process (click's runner), on both backends: the
operator is recorded as the actor, ``--dry-run`` changes nothing, ``--json``
is one object per run, and bad input is a one-line error with a non-zero
exit and nothing changed."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from cairn.cli.main import main
from tests.encryption.test_sealed_store import build, drive


def cli(place: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", place, *args], env={"COLUMNS": "200", "CAIRN_ACTOR": "ada"})


def moves(app: Any, run_id: str) -> list[tuple[str, str, str]]:
    """The operator log's archive records of ``run_id``: (action, actor, how it was authenticated)."""
    return [(r[5], r[6], r[7]) for r in app.store.operator_log() if r[3] == "archive" and r[4] == run_id]


def test_archive_run_dry_run_json_restore_and_show(place: str) -> None:
    app = build(place, None)
    done = app.start("canary", "one", tenant="a").run_id
    drive(app, done, "ok")
    live = app.start("canary", "two", tenant="a").run_id  # suspended: never archived
    history = app.history(done)

    dry = cli(place, "archive", "run", "--older-than", "0s", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.output.splitlines() == [f"would archive {done}", "would archive 1 run"]
    assert app.store.run_archive(done) is None

    ran = cli(place, "archive", "run", "--older-than", "0s", "--json")
    assert ran.exit_code == 0, ran.output
    (record,) = [json.loads(line) for line in ran.output.splitlines()]
    assert record["run_id"] == done
    assert record["actor"] == "user:ada"  # $CAIRN_ACTOR, the configured identity
    assert record["stored_bytes"] < record["rows_bytes"]
    assert app.store.run_archive(live) is None
    assert app.history(done) == history

    run_shown = cli(place, "show", done)  # the journal read from the archive, and where it is
    assert run_shown.exit_code == 0, run_shown.output
    assert "shout" in run_shown.output
    assert f"by user:ada (object {record['ref'][:16]}...; cairn archive restore {done})" in run_shown.output
    shown = cli(place, "archive", "show", done)
    assert shown.exit_code == 0
    assert "by user:ada" in shown.output
    again = cli(place, "archive", "run", "--older-than", "0s")
    assert again.output.splitlines() == ["archived 0 runs"]

    restored = cli(place, "archive", "restore", done, "--json")
    assert restored.exit_code == 0, restored.output
    assert json.loads(restored.output)["run_id"] == done
    assert json.loads(restored.output)["restored_by"] == "user:ada"  # who restored, as who archived
    assert moves(app, done) == [("archive.move", "user:ada", "configured"),
                                ("archive.restore", "user:ada", "configured")]
    logged = cli(place, "audit", "log", "--kind", "archive", "--json")
    assert logged.exit_code == 0, logged.output
    assert [(e["event"], e["actor"]) for e in map(json.loads, logged.output.splitlines())] == [
        ("archive.move", "user:ada"), ("archive.restore", "user:ada")]
    assert app.store.run_archive(done) is None
    assert app.history(done) == history
    app.close()


def test_bad_input_is_one_line_and_changes_nothing(place: str) -> None:
    app = build(place, None)
    done = app.start("canary", "one", tenant="a").run_id
    drive(app, done, "ok")
    for args, code, message in (
        (("archive", "run", "--older-than", "soon"), 2, "'soon' is not a duration"),
        (("archive", "restore", done), 1, "is not archived"),
        (("archive", "restore", "nope"), 1, "no run with id 'nope'"),
        (("archive", "show", done), 1, "is not archived"),
        (("archive", "run", "--older-than", "1d", "--limit", "0"), 2, "--limit"),
    ):
        result = cli(place, *args)
        assert result.exit_code == code, result.output
        assert message in result.output
        assert "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert app.store.run_archive(done) is None
    app.close()
