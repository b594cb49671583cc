"""The LangGraph ``BaseStore`` adapter (issue 14 item 8) on both backends:
LangGraph's own store calls (put/get/search/delete/list_namespaces, TTL in
minutes with refresh on read), and a real LangGraph graph whose node uses it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

import pytest

import cairn
from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore

    from cairn.memory.langgraph import CairnStore


def _store(app: cairn.App, **kwargs: Any) -> CairnStore:
    """The adapter over ``app``'s store. LangGraph (the dev extra has it) is
    imported here, by the tests that use it, not when pytest collects this
    module: it costs a second of CPU in every process that collects."""
    from cairn.memory.langgraph import CairnStore

    return CairnStore(app.store, app.runtime.payloads, actor="langgraph:test", **kwargs)


def test_the_base_store_api(app: cairn.App) -> None:
    store = _store(app)
    store.put(("users", "u1"), "prefs", {"theme": "dark", "lang": "en"})
    store.put(("users", "u2"), "prefs", {"theme": "light", "lang": "<b>fr</b>"})
    store.put(("docs",), "d1", {"text": "hello"}, index=False)
    got = store.get(("users", "u1"), "prefs")
    assert got is not None
    assert (got.value, got.namespace, got.key) == ({"theme": "dark", "lang": "en"}, ("users", "u1"), "prefs")
    assert [i.namespace for i in store.search(("users",))] == [("users", "u1"), ("users", "u2")]
    assert [i.namespace for i in store.search(("users",), filter={"theme": "light"})] == [("users", "u2")]
    assert store.list_namespaces() == [("docs",), ("users", "u1"), ("users", "u2")]
    assert store.list_namespaces(prefix=("users",), max_depth=1) == [("users",)]
    assert store.list_namespaces(suffix=("u2",)) == [("users", "u2")]
    store.delete(("users", "u1"), "prefs")
    assert store.get(("users", "u1"), "prefs") is None
    [item] = app.operator.memory_items("default", ("users",))
    assert item.actor == "langgraph:test"  # provenance of a write outside a run
    with pytest.raises(cairn.CairnError, match="embedder"):
        store.search(("users",), query="dark mode")


def test_ttl_in_minutes_and_refresh_on_read(app: cairn.App) -> None:
    store = _store(app, ttl={"default_ttl": 1.0, "refresh_on_read": True})
    store.put(("s",), "k", {"v": 1})
    [item] = app.operator.memory_items("default", ("s",))
    assert item.expires_at is not None
    assert item.expires_at - item.updated_at == pytest.approx(60.0)
    store.put(("s",), "forever", {"v": 2}, ttl=None)
    forever = [i for i in app.operator.memory_items("default", ("s",)) if i.key == "forever"]
    assert [i.expires_at for i in forever] == [None]


class State(TypedDict):
    user: str
    text: str
    seen: list[str]


def test_a_real_langgraph_graph_uses_it(app: cairn.App) -> None:
    from langgraph import graph as langgraph_graph

    def remember(state: State, *, store: BaseStore) -> dict[str, Any]:
        namespace = ("memories", state["user"])
        store.put(namespace, f"m{len(store.search(namespace))}", {"text": state["text"]})
        return {"seen": [i.value["text"] for i in store.search(namespace)]}

    builder = langgraph_graph.StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_edge(langgraph_graph.START, "remember")
    builder.add_edge("remember", langgraph_graph.END)
    graph = builder.compile(store=_store(app))
    assert graph.invoke({"user": "ada", "text": "likes tea", "seen": []})["seen"] == ["likes tea"]
    assert graph.invoke({"user": "ada", "text": "hates <script>", "seen": []})["seen"] == [
        "likes tea", "hates <script>"]
    assert graph.invoke({"user": "bob", "text": "x", "seen": []})["seen"] == ["x"]
    assert len(app.operator.memory_items("default", ("memories",))) == 3


def test_semantic_search_ranks_by_the_vector_index_once_indexed(app: cairn.App) -> None:
    embedder = HashEmbedder(64)
    store = _store(app, embedder=embedder)
    store.put(("notes", "ada"), "n1", {"text": "green tea with jasmine", "kind": "drink"})
    store.put(("notes", "ada"), "n2", {"text": "black coffee", "kind": "drink"})
    store.put(("notes", "ada"), "n3", {"text": "a red bicycle", "kind": "toy"})
    store.put(("notes", "bob"), "n1", {"text": "jasmine tea too", "kind": "drink"})
    assert store.search(("notes", "ada"), query="jasmine tea") == []  # not indexed yet
    assert Indexer(app.store, embedder).drain() == 4
    found = store.search(("notes", "ada"), query="jasmine tea", limit=2)
    assert len(found) == 2
    assert (found[0].namespace, found[0].key) == (("notes", "ada"), "n1")
    assert all(i.namespace == ("notes", "ada") for i in found)  # the prefix scopes the index's scan
    assert found[0].score is not None
    assert found[0].score >= (found[1].score or 0.0)
    drinks = store.search(("notes",), query="a red bicycle", filter={"kind": "drink"}, limit=10)
    assert {(i.namespace, i.key) for i in drinks} == {(("notes", "ada"), "n1"), (("notes", "ada"), "n2"),
                                                       (("notes", "bob"), "n1")}
