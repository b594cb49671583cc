"""``cairn memory ls|get|search|rm`` on both backends: what the operator
sees, with provenance; deletion by scope; bad input is one line, exit 1,
nothing deleted; hostile text never forges a line."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import cairn
from tests.backends import StoreBackend
from tests.cli.test_cli import check_error, cli


@pytest.fixture
def app(backend: StoreBackend) -> Iterator[cairn.App]:
    application = cairn.App(db=backend.url)

    @application.step()
    def remember(text: str) -> str:
        memory = cairn.step_info().memory
        memory.put(("users", "u1"), "pref", {"text": text}, metadata={"k": 1})
        memory.run.put("note", text)
        memory.thread().append(text)
        return text

    @application.workflow(name="mem")
    def mem(ctx: cairn.Context, text: str) -> str:
        return remember(text)

    application.run(mem, "line one\nerror: forged <b>x</b>", run_id="r1", thread_id="th")
    application.operator.memory("default").put(("users", "u2"), "pref", "by hand")
    application.operator.memory("acme").put(("users", "u1"), "pref", "acme's")
    yield application
    application.close()


def test_ls_lists_items_with_their_provenance(app: cairn.App, backend: StoreBackend) -> None:
    result = cli("memory", "ls", "--db", backend.url, "--tenant", "default", "--namespace", "users")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2  # the newline in the value does not forge a line
    assert lines[0].startswith("users/u1  pref  v1  run r1 @0")
    assert lines[1].startswith("users/u2  pref  v1  by app:")  # the operator that wrote it
    everyone = cli("memory", "ls", "--db", backend.url, "--json")
    rows = json.loads(everyone.stdout)
    assert sorted((r["tenant"], r["namespace"][1]) for r in rows) == [("acme", "u1"), ("default", "u1"),
                                                                      ("default", "u2")]


def test_ls_thread_and_run(app: cairn.App, backend: StoreBackend) -> None:
    thread = json.loads(cli("memory", "ls", "--db", backend.url, "--thread", "th", "--json").stdout)
    assert [(m["index"], m["run_id"]) for m in thread] == [(0, "r1")]
    run = json.loads(cli("memory", "ls", "--db", backend.url, "--run", "r1", "--json").stdout)
    assert run["run_memory"] == {"note": "line one\nerror: forged <b>x</b>"}
    assert [i["key"] for i in run["items"]] == ["pref"]


def test_get_shows_one_item(app: cairn.App, backend: StoreBackend) -> None:
    result = cli("memory", "get", "--db", backend.url, "--namespace", "users/u1", "pref", "--json")
    assert result.exit_code == 0, result.stderr
    item = json.loads(result.stdout)
    assert (item["value"], item["run_id"], item["metadata"]) == (
        {"text": "line one\nerror: forged <b>x</b>"}, "r1", {"k": 1})
    same = cli("memory", "get", "--db", backend.url, "--label", "users", "--label", "u1", "pref", "--json")
    assert json.loads(same.stdout) == item


def test_rm_by_scope(app: cairn.App, backend: StoreBackend) -> None:
    assert cli("memory", "rm", "--db", backend.url, "--namespace", "users/u2", "pref").stdout.strip() == \
        "deleted 1 memory row"
    assert cli("memory", "rm", "--db", backend.url, "--thread", "th").stdout.strip() == "deleted 1 memory row"
    assert cli("memory", "rm", "--db", backend.url, "--run", "r1").stdout.strip() == "deleted 2 memory rows"
    assert app.operator.memory_items("default") == []
    assert [i.value for i in app.operator.memory_items("acme")] == ["acme's"]
    assert cli("memory", "rm", "--db", backend.url, "--tenant", "acme", "--all").exit_code == 0
    assert app.operator.memory_items(None) == []


@pytest.mark.parametrize(("args", "fragment"), [
    (("rm",), "exactly one of"),
    (("rm", "--namespace", "users", "--thread", "th"), "--namespace and --thread"),
    (("rm", "--all"), "needs --tenant"),
    (("rm", "--namespace", "users//u1"), "empty label"),
    (("rm", "--namespace", "a", "--label", "b"), "not both"),
    (("get", "pref"), "needs the item's namespace"),
    (("get", "--namespace", "users/u1", "nope"), "no item 'nope'"),
    (("ls", "--limit", "0"), "at least 1"),
    (("rm", "--run", "no-such-run"), "no run"),
    (("rm", "--namespace", "a\x1fb"), "U+001F"),
    (("search", "q"), "embedder"),
])
def test_bad_input_is_one_line_and_deletes_nothing(
    app: cairn.App, backend: StoreBackend, args: tuple[str, ...], fragment: str
) -> None:
    before = app.operator.memory_items(None)
    result = cli("memory", *args, "--db", backend.url)
    check_error(result, 1, fragment)
    assert app.operator.memory_items(None) == before


def test_tiers_reports_the_vectors_and_bytes_of_each_tier(backend: StoreBackend) -> None:
    from cairn.memory.embedders import HashEmbedder
    from cairn.memory.indexer import Indexer

    embedder = HashEmbedder(32)
    app = cairn.App(db=backend.url, embedder=embedder)
    try:
        memory = app.operator.memory("acme")
        for i in range(3):
            memory.put(("docs",), f"d{i}", {"n": i}, index=f"document {i}")
        assert Indexer(app.store, embedder).drain() == 3
        assert app.store.tier_vectors(1e-9).cooled == 3  # everything is "untouched" past a nanosecond
        memory.put(("docs",), "fresh", {"n": 9}, index="a fresh one")
        assert Indexer(app.store, embedder).drain() == 1
    finally:
        app.close()
    result = cli("memory", "tiers", "--db", backend.url, "--tenant", "acme", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    item_bytes = report["hot"]["item_bytes"]
    assert item_bytes == len(b'{"n":0}') * 4  # four small values, inline in their rows
    assert report == {
        "hot": {"vectors": 1, "bytes": 32 * 4, "items": 4, "item_bytes": item_bytes,
                "item_raw_bytes": item_bytes},
        "cold": {"vectors": 3, "bytes": 3 * 32, "items": 0, "item_bytes": 0, "item_raw_bytes": 0}}
    text = cli("memory", "tiers", "--db", backend.url)
    assert text.exit_code == 0, text.stderr
    assert text.stdout.split() == [
        "hot", "1", "vectors", "128", "bytes", "4", "items", str(item_bytes), "bytes",
        f"({item_bytes}", "raw)",
        "cold", "3", "vectors", "96", "bytes", "0", "items", "0", "bytes", "(0", "raw)"]


def test_tier_moves_idle_values_cold_and_tiers_reports_their_bytes(backend: StoreBackend) -> None:
    app = cairn.App(db=backend.url)
    note = {"text": "the user prefers short answers and dark mode; " * 8}
    try:
        memory = app.operator.memory("acme")
        for i in range(3):
            memory.put(("notes",), f"n{i}", {**note, "n": i})
    finally:
        app.close()
    moved = cli("memory", "tier", "--idle", "1e-9", "--db", backend.url, "--json")
    assert moved.exit_code == 0, moved.stderr
    assert json.loads(moved.stdout) == {"cooled": 3, "rewarmed": 0}
    report = json.loads(cli("memory", "tiers", "--db", backend.url, "--json").stdout)
    cold = report["cold"]
    assert cold["items"] == 3
    assert report["hot"]["items"] == 0
    assert 0 < cold["item_bytes"] < cold["item_raw_bytes"] / 3  # repetitive JSON compresses well
    shown = cli("memory", "get", "--db", backend.url, "--tenant", "acme", "--namespace", "notes", "n1",
                "--json")
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["value"] == {**note, "n": 1}  # read through, as it was
    check_error(cli("memory", "tier", "--db", backend.url), 1, "cold_after")
    check_error(cli("memory", "tier", "--idle", "0", "--db", backend.url), 1, "--idle")
