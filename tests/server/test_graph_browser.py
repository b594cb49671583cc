"""A graph run's dashboard page in a real browser (chromium, headless, as
``test_browser.py``): its path and a diff are rendered, markup in node
names, state values and diff keys is shown as text (no element made of it,
no script of it run), and the diff form picks two steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import cairn

from .conftest import TENANT, LiveServer
from .test_browser import CHROMIUM, HOSTILE, _shots, browse
from .test_graph_page import NODE, Notes

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"),
    pytest.mark.xdist_group("chromium"),
]


FAN = "<img src=q onerror=alert(9)>"


def graph() -> cairn.Graph:
    g = cairn.Graph(Notes)

    def think(state: Notes) -> dict[str, Any]:
        n = state["n"] + 1
        return {"notes": [f"{HOSTILE} {n}"], "n": n, "meta": {f"<b>k{n}</b>": HOSTILE}}

    g.node(think, name=NODE)
    g.node(lambda item: {"notes": [f"<img src=z onerror=alert({item})>"]}, name=FAN)
    g.edge(cairn.START, NODE)
    g.route(NODE, lambda s: [cairn.Send(FAN, i) for i in range(3)] if s["n"] == 1
            else (cairn.END if s["n"] >= 3 else NODE))
    g.edge(FAN, NODE)
    return g


@pytest.mark.slow
def test_a_graph_runs_path_and_diff_in_a_browser_with_markup_as_text(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")
    token = app.tokens.mint(TENANT, "viewer", "ada").secret
    app.run(app.graph("hostile", graph()), {"notes": [], "meta": {}, "n": 0}, tenant=TENANT,
            run_id="g<b>1</b>")
    try:
        with LiveServer(app, heartbeat=1.0) as server:
            path = "/runs/" + quote("g<b>1</b>", safe="") + quote("?a=0&b=4", safe="")
            dom = browse(f"{server.url}/login?next={path}#token={token}", _shots(tmp_path) / "graph-run.png",
                         stream_ends=True)
            steps = [attrs.get("data-step") for tag, attrs in dom.elements
                     if tag == "tr" and "data-step" in attrs]
            assert steps == ["4", "3", "2", "1", "0"]
            tables = {attrs.get("id") for tag, attrs in dom.elements if tag == "table"}
            assert {"graph-path", "graph-diff"} <= tables
            path_text = dom.text.get("graph-path", "")
            assert NODE in path_text  # the node's name, as text
            assert f"{FAN} \u00d73" in path_text  # the fan-out, counted once
            diff_text = dom.text.get("graph-diff", "")
            assert 'meta["<b>k3</b>"]' in diff_text
            assert "<script>document.title='pwned'</script>" in diff_text
            assert not [tag for tag, _ in dom.elements if tag in ("img", "b", "i")], "markup became elements"
            assert all("onerror" not in attrs for _, attrs in dom.elements)
            body = next(attrs for tag, attrs in dom.elements if tag == "body")
            assert "data-pwned" not in body
            assert dom.title.startswith("Run g<b>1</b>")
    finally:
        app.close()
