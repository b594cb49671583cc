"""``--app tests.cli.graph_app:app``: a small graph on ``$CAIRN_DB`` (the
time-travel commands' tests, ``test_graph_cli.py``)."""

from typing import Annotated, Any, TypedDict

import cairn


class Notes(TypedDict):
    notes: Annotated[list[str], cairn.append]
    n: int
    meta: dict[str, Any]


def register(app: cairn.App) -> cairn.Workflow[Any]:
    g = cairn.Graph(Notes)

    def first(state: Notes) -> dict[str, Any]:
        return {"notes": ["first"], "n": state["n"] + 1, "meta": {"who": {"name": "ada"}}}

    def second(state: Notes) -> dict[str, Any]:
        return {"notes": [f"second n={state['n']}"], "meta": {"who": {"name": "grace"}}}

    g.node(first)
    g.node(second)
    g.edge(cairn.START, "first")
    g.edge("first", "second")
    g.edge("second", cairn.END)
    return app.graph("notes", g)


app = cairn.App()
register(app)
