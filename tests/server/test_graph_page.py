"""The graph section of a run's dashboard page, over plain HTTP.

A graph run's page shows its path (super-step by super-step: what ran,
what comes next, a ``Send`` fan-out counted once), paginated so a long run
is never rendered whole, and the diff between any two checkpoints, read
from the checkpoints without the graph's code. Markup in node names, state
values and diff paths is escaped (the browser test checks what a browser
makes of it), and another tenant's run shows nothing."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypedDict
from urllib.parse import quote

import httpx
import pytest

import cairn
from cairn.server import graphpage

from .conftest import OTHER, TENANT, LiveServer, Setup

MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"
NODE = "<b>think</b>"


class Notes(TypedDict):
    notes: Annotated[list[str], cairn.append]
    meta: dict[str, str]
    n: int


def hostile_graph(steps: int) -> cairn.Graph:
    g = cairn.Graph(Notes)

    def think(state: Notes) -> dict[str, Any]:
        n = state["n"] + 1
        return {"notes": [f"{MARKUP} {n}"], "n": n, "meta": {f"<i>k{n}</i>": MARKUP}}

    def fan(item: Any) -> dict[str, Any]:
        return {"notes": [f"item {item}"]}

    g.node(think, name=NODE)
    g.node(fan, name="fan")
    g.edge(cairn.START, NODE)
    g.route(NODE, lambda s: [cairn.Send("fan", i) for i in range(12)] if s["n"] == 2
            else (cairn.END if s["n"] >= steps else NODE))
    g.edge("fan", NODE)
    return g


def page(client: httpx.Client, token: str, run_id: str, query: str = "") -> httpx.Response:
    client.cookies.set("cairn_token", token)
    return client.get(f"/runs/{quote(run_id, safe='')}{query}")


def section(html: str) -> str:
    """The graph section of a page (the timeline below it pages on its own)."""
    start = html.index('<h2 id="graph">')
    return html[start:html.index("</section>", start)]


def rows(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<tr data-step="(\d+)">', html)]


def test_the_path_and_a_diff_are_shown_with_markup_as_text(setup: Setup, client: httpx.Client) -> None:
    workflow = setup.app.graph("hostile", hostile_graph(4))
    setup.app.run(workflow, {"notes": [], "meta": {}, "n": 0}, tenant=TENANT, run_id="g<i>1</i>")
    shown = page(client, setup.tokens["viewer"], "g<i>1</i>", "?a=1&b=3")
    assert shown.status_code == 200, shown.text
    html = shown.text
    assert rows(html) == [5, 4, 3, 2, 1, 0]  # newest first: the input, think, think, fan x12, think, think
    assert "&lt;b&gt;think&lt;/b&gt;" in html
    assert '<span class="node">fan</span><span class="fanout"> \u00d712</span>' in html  # one entry, counted
    for markup in ("<b>", "<i>", "<script>alert", "<img"):
        assert markup not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt; 2" in html
    diff = html[html.index('<table id="graph-diff"'):]
    diff = diff[:diff.index("</table>")]
    assert 'data-a="1" data-b="3"' in diff
    assert '<tr class="change-appended"><td class="path">notes</td>' in diff
    assert "item 11" in diff
    # a key full of markup is one quoted path element, escaped
    assert '<td class="path">meta[&#34;&lt;i&gt;k2&lt;/i&gt;&#34;]</td><td>added</td>' in diff
    assert '<td class="path">meta[&#34;&lt;i&gt;k1&lt;/i&gt;&#34;]</td><td>removed</td>' in diff
    assert '<tr class="change-replaced"><td class="path">n</td>' in diff


def test_another_tenants_graph_run_shows_nothing(setup: Setup, client: httpx.Client) -> None:
    workflow = setup.app.graph("hostile", hostile_graph(2))
    setup.app.run(workflow, {"notes": [], "meta": {}, "n": 0}, tenant=OTHER, run_id="theirs")
    shown = page(client, setup.tokens["admin"], "theirs", "?a=0&b=1")
    assert shown.status_code == 404
    assert "think" not in shown.text
    assert "graph-path" not in shown.text


def test_a_bad_step_is_a_clear_message_and_the_page_still_shows(setup: Setup, client: httpx.Client) -> None:
    workflow = setup.app.graph("hostile", hostile_graph(2))
    setup.app.run(workflow, {"notes": [], "meta": {}, "n": 0}, tenant=TENANT, run_id="g2")
    missing = page(client, setup.tokens["viewer"], "g2", "?a=0&b=999")
    assert missing.status_code == 200
    assert "has no checkpoint at super-step 999" in missing.text
    assert rows(missing.text) == [4, 3, 2, 1, 0]
    bad = page(client, setup.tokens["viewer"], "g2", "?a=<x>")
    assert bad.status_code == 400
    assert "a must be a super-step number, not &#39;&lt;x&gt;&#39;" in bad.text


def test_a_plain_workflow_run_has_no_graph_section(setup: Setup, client: httpx.Client) -> None:
    run_id = setup.app.start(setup.workflows["echo"], "x", tenant=TENANT).run_id
    shown = page(client, setup.tokens["viewer"], run_id)
    assert shown.status_code == 200
    assert "graph-path" not in shown.text


class Counter(TypedDict):
    log: Annotated[list[str], cairn.append]
    n: int


def test_a_3000_step_run_is_shown_a_page_at_a_time(sqlite_setup: Setup) -> None:
    app = sqlite_setup.app
    g = cairn.Graph(Counter)
    g.node(lambda s: {"n": s["n"] + 1, "log": [f"<u>{s['n']}</u>" * 20]}, name="step")
    g.edge(cairn.START, "step")
    g.route("step", lambda s: cairn.END if s["n"] >= 3000 else "step")
    app.run(app.graph("long", g), {"log": [], "n": 0}, tenant=TENANT, run_id="long")
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        token = sqlite_setup.tokens["viewer"]
        first = page(client, token, "long")
        assert rows(first.text) == list(range(3000, 3000 - graphpage.PAGE, -1))
        # the timeline's checkpoint rows name what ran and changed, not the state again
        assert len(first.text) < 400_000, len(first.text)
        assert "checkpoint: ran step; changed n, log" in first.text
        older = re.search(r'id="graph-older" href="([^"]+)"', first.text)
        assert older is not None
        assert 'id="graph-newer"' not in first.text
        second = client.get(older.group(1).replace("&amp;", "&"))
        assert rows(second.text) == list(range(3000 - graphpage.PAGE, 3000 - 2 * graphpage.PAGE, -1))
        newer = re.search(r'id="graph-newer" href="([^"]+)"', second.text)
        assert newer is not None
        assert rows(client.get(newer.group(1).replace("&amp;", "&")).text) == rows(first.text)
        oldest = page(client, token, "long", f"?steps={graphpage.PAGE - 10}")
        assert rows(oldest.text) == list(range(graphpage.PAGE - 11, -1, -1))
        assert 'id="graph-older"' not in oldest.text
        whole = page(client, token, "long", "?a=0&b=3000")  # 3,000 appended items: cut, not all rendered
        assert whole.status_code == 200
        assert "more characters)" in whole.text
        assert len(section(whole.text)) < 100_000
        assert "<u>" not in whole.text


class Big(TypedDict):
    big: str


@pytest.mark.parametrize("value", ["x" * (10 * 1024 * 1024)], ids=["10MB"])
def test_a_10_mb_value_is_cut_in_the_diff(sqlite_setup: Setup, value: str) -> None:
    app = sqlite_setup.app
    g = cairn.Graph(Big)
    g.node(lambda s: {"big": value}, name="load")
    g.edge(cairn.START, "load")
    g.edge("load", cairn.END)
    app.run(app.graph("big", g), {"big": ""}, tenant=TENANT, run_id="big")
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        shown = page(client, sqlite_setup.tokens["viewer"], "big", "?a=0&b=1")
        assert shown.status_code == 200
        assert f"({len(value) + 2 - graphpage.MAX_VALUE:,} more characters)" in shown.text
        assert len(section(shown.text)) < 20_000


def test_a_failed_graph_runs_error_and_path_are_text(setup: Setup, client: httpx.Client) -> None:
    g = cairn.Graph(Notes)

    def explode(state: Notes) -> None:
        raise RuntimeError(MARKUP)

    g.node(explode, name=NODE)
    g.edge(cairn.START, NODE)
    g.edge(NODE, cairn.END)
    with pytest.raises(cairn.RunFailed):
        setup.app.run(setup.app.graph("explodes", g), {"notes": [], "meta": {}, "n": 0}, tenant=TENANT,
                      run_id="boom")
    html = page(client, setup.tokens["viewer"], "boom").text
    assert rows(html) == [0]
    assert "RuntimeError: &lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    for markup in ("<b>", "<script>alert", "<img"):
        assert markup not in html


def test_a_damaged_checkpoint_with_markup_is_one_row_of_text_and_the_others_show(
        setup: Setup, client: httpx.Client, request: pytest.FixtureRequest) -> None:
    """A checkpoint row damaged behind Cairn's back (here: a field name full
    of markup with a version after the checkpoint) is listed as its error,
    escaped, over HTTP and on the page; its neighbours still show, and a
    diff that needs it says why instead of failing the page."""
    from tests.graph.test_damaged import Rows

    assert setup.app.db_url is not None
    with cairn.App(db=setup.app.db_url) as elsewhere:  # the server's app has read nothing of the run
        elsewhere.run(elsewhere.graph("hostile", hostile_graph(4)), {"notes": [], "meta": {}, "n": 0},
                      tenant=TENANT, run_id="d")
    rows_of = Rows(setup.app, request)
    record = rows_of.record("d", 4)
    record["versions"][MARKUP + "\n"] = [9, 9]
    rows_of.write(4, record, run_id="d")

    html = page(client, setup.tokens["viewer"], "d", "?a=3&b=4").text
    assert rows(html) == [5, 3, 2, 1, 0]  # 4 is listed as damaged (a row of its own)
    damaged = section(html)[section(html).index('class="damaged"'):]
    assert "checkpoint 4 of run &#39;d&#39; is damaged: field &#39;&lt;script&gt;alert(1)" in damaged
    assert "<script>alert" not in html
    assert "<img" not in html
    assert 'id="graph-diff-error"' in html
    assert "checkpoint 4 of run &#39;d&#39; is damaged" in html

    client.cookies.set("cairn_token", setup.tokens["viewer"])
    listed = client.get("/api/runs/d/checkpoints").json()["checkpoints"]
    assert [(c["step"], c["error"] is None) for c in listed] == [
        (5, True), (4, False), (3, True), (2, True), (1, True), (0, True)]
    assert "\n" not in listed[1]["error"]
    assert "checkpoint 4 of run 'd' is damaged" in listed[1]["error"]
    refused = client.get("/api/runs/d/checkpoints/4")
    assert refused.status_code == 422
    assert "checkpoint 4 of run 'd' is damaged" in refused.text
    assert client.get("/api/runs/d/checkpoints/3").status_code == 200
