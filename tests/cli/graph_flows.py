"""The small graph of the time-travel commands' tests (``test_graph_cli.py``),
registered on an app by ``register``; ``graph_app`` is the ``--app`` module
(importing this one opens no database, so collecting the tests does not)."""

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

