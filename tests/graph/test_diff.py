"""The typed diff of two graph states (cairn.graph.diff), on hand-built cases.

Pure functions, no store: every kind of change, nested paths, type changes,
None and empty values, markup, keys that look like paths, dataclass and
pydantic states, the first divergence of two runs, and the fast path for a
long list that only grew.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pydantic
import pytest

from cairn.graph import diff as graphdiff
from cairn.graph.diff import Change, diff, equal, first_divergence, to_json


def test_equal_states_have_no_changes() -> None:
    state = {"messages": ["a", "b"], "n": 2, "profile": {"name": "x", "tags": []}}
    assert diff(state, state) == []
    assert diff(state, json.loads(json.dumps(state))) == []


def test_a_replaced_scalar_is_old_to_new() -> None:
    assert diff({"n": 1, "s": "x"}, {"n": 2, "s": "x"}) == [Change(("n",), "replaced", 1, 2)]


def test_added_and_removed_fields() -> None:
    assert diff({"a": 1, "b": 2}, {"b": 2, "c": 3}) == [
        Change(("a",), "removed", 1, None),
        Change(("c",), "added", None, 3),
    ]


def test_a_list_that_grew_at_its_end_is_an_append() -> None:
    assert diff({"messages": ["a", "b"]}, {"messages": ["a", "b", "c", "d"]}) == [
        Change(("messages",), "appended", None, ["c", "d"])]
    assert diff({"messages": []}, {"messages": ["a"]}) == [Change(("messages",), "appended", None, ["a"])]


def test_an_insert_and_a_delete_inside_a_list() -> None:
    assert diff({"xs": [1, 2, 3]}, {"xs": [1, 9, 8, 2, 3]}) == [Change(("xs", 1), "inserted", None, [9, 8])]
    assert diff({"xs": [1, 2, 3, 4]}, {"xs": [1, 4]}) == [Change(("xs", 1), "deleted", [2, 3], None)]
    assert diff({"xs": [1, 2, 3]}, {"xs": [1]}) == [Change(("xs", 1), "deleted", [2, 3], None)]
    assert diff({"xs": [1, 2]}, {"xs": []}) == [Change(("xs", 0), "deleted", [1, 2], None)]
    assert diff({"xs": [1, 2]}, {"xs": [0, 1, 2]}) == [Change(("xs", 0), "inserted", None, [0])]


def test_a_list_of_the_same_length_is_diffed_item_by_item() -> None:
    old = {"messages": [{"role": "user", "content": "hi"}, {"role": "ai", "content": "hello"}]}
    new = {"messages": [{"role": "user", "content": "hi"}, {"role": "ai", "content": "bye"}]}
    assert diff(old, new) == [Change(("messages", 1, "content"), "replaced", "hello", "bye")]
    assert diff({"xs": [1, 2, 3]}, {"xs": [7, 2, 8]}) == [
        Change(("xs", 0), "replaced", 1, 7), Change(("xs", 2), "replaced", 3, 8)]


def test_a_list_changed_in_several_places_and_resized_is_replaced() -> None:
    assert diff({"xs": [1, 2, 3]}, {"xs": [0, 2, 5, 6]}) == [
        Change(("xs",), "replaced", [1, 2, 3], [0, 2, 5, 6])]


def test_an_old_item_changed_and_new_ones_added_is_not_an_append() -> None:
    old = {"messages": ["a", "b", "c"]}
    new = {"messages": ["a", "B", "c", "d"]}
    changes = diff(old, new)
    assert [c.kind for c in changes] != ["appended"]
    assert changes == [Change(("messages",), "replaced", ["a", "b", "c"], ["a", "B", "c", "d"])]


def test_nested_dicts_by_key_path() -> None:
    old = {"profile": {"name": "Ada", "address": {"city": "London", "zip": "N1"}, "age": 36}}
    new = {"profile": {"name": "Ada", "address": {"city": "Paris", "country": "FR"}, "age": 36}}
    assert diff(old, new) == [
        Change(("profile", "address", "city"), "replaced", "London", "Paris"),
        Change(("profile", "address", "zip"), "removed", "N1", None),
        Change(("profile", "address", "country"), "added", None, "FR"),
    ]


def test_type_changes_are_replacements() -> None:
    assert diff({"v": [1, 2]}, {"v": {"a": 1}}) == [Change(("v",), "replaced", [1, 2], {"a": 1})]
    assert diff({"v": {"a": 1}}, {"v": [1]}) == [Change(("v",), "replaced", {"a": 1}, [1])]
    assert diff({"v": "1"}, {"v": 1}) == [Change(("v",), "replaced", "1", 1)]
    assert diff({"v": [1]}, {"v": "[1]"}) == [Change(("v",), "replaced", [1], "[1]")]


def test_numbers_that_python_calls_equal_are_different_values() -> None:
    """``1 == 1.0 == True`` in Python; as JSON they are three values."""
    assert diff({"v": 1}, {"v": True}) == [Change(("v",), "replaced", 1, True)]
    assert diff({"v": 1}, {"v": 1.0}) == [Change(("v",), "replaced", 1, 1.0)]
    assert diff({"xs": [0, 1, 2]}, {"xs": [0, True, 2]}) == [Change(("xs", 1), "replaced", 1, True)]
    assert diff({"xs": [1]}, {"xs": [1.0, 2]}) == [Change(("xs",), "replaced", [1], [1.0, 2])]
    assert diff({"d": {"k": 0}}, {"d": {"k": False}}) == [Change(("d", "k"), "replaced", 0, False)]
    assert not equal([1, 2], [True, 2])
    assert first_divergence([{"n": 1}], [{"n": True}]) == 0


def test_none_and_empty_values() -> None:
    assert diff({"v": None}, {"v": None}) == []
    assert diff({"v": None}, {"v": 0}) == [Change(("v",), "replaced", None, 0)]
    assert diff({"v": []}, {"v": None}) == [Change(("v",), "replaced", [], None)]
    assert diff({"v": {}}, {"v": []}) == [Change(("v",), "replaced", {}, [])]
    assert diff({"v": ""}, {"v": "x"}) == [Change(("v",), "replaced", "", "x")]
    assert diff({"v": None}, {}) == [Change(("v",), "removed", None, None)]
    assert diff({}, {"v": None}) == [Change(("v",), "added", None, None)]
    assert diff({}, {}) == []
    assert diff({"v": []}, {"v": []}) == []
    assert diff({"v": {}}, {"v": {"a": {}}}) == [Change(("v", "a"), "added", None, {})]
    assert diff(None, None) == []
    assert diff(None, {"a": 1}) == [Change((), "replaced", None, {"a": 1})]


def test_markup_in_strings_is_passed_through() -> None:
    old, new = "<b>bold</b> & co", "<script>alert('x')</script> &amp; \"q\""
    changes = diff({"text": old}, {"text": new})
    assert changes == [Change(("text",), "replaced", old, new)]
    assert to_json(changes) == [{"path": ["text"], "kind": "replaced", "old": old, "new": new}]
    assert diff({"<k>": 1}, {"<k>": 2})[0].path == ("<k>",)


def test_keys_that_look_like_paths_stay_single_keys() -> None:
    assert diff({"a.b": 1, "a": {"b": 1}}, {"a.b": 2, "a": {"b": 1}}) == [Change(("a.b",), "replaced", 1, 2)]
    assert diff({"a": {"b": 1}}, {"a": {"b": 3}}) == [Change(("a", "b"), "replaced", 1, 3)]
    # a key "0" is not the index 0, and a dict with int keys keeps them as ints
    by_key = diff({"m": {"0": "x"}}, {"m": {"0": "y"}})
    by_index = diff({"m": ["x"]}, {"m": ["y"]})
    by_int_key = diff({"m": {0: "x"}}, {"m": {0: "y"}})
    assert by_key == [Change(("m", "0"), "replaced", "x", "y")]
    assert by_index == [Change(("m", 0), "replaced", "x", "y")]
    assert by_int_key == by_index
    assert to_json(by_key)[0]["path"] == ["m", "0"]
    assert to_json(by_index)[0]["path"] == ["m", 0]
    assert diff({"": 1, "[0]": 1, "a/b": 1}, {"": 2, "[0]": 1, "a/b": 3}) == [
        Change(("",), "replaced", 1, 2), Change(("a/b",), "replaced", 1, 3)]


def test_the_order_is_the_old_keys_then_the_new_ones() -> None:
    old = {"z": 1, "a": 1, "m": {"y": 1, "b": 1}}
    new = {"q": 2, "m": {"c": 2, "b": 2}, "a": 2}
    expected = [
        Change(("z",), "removed", 1, None),
        Change(("a",), "replaced", 1, 2),
        Change(("m", "y"), "removed", 1, None),
        Change(("m", "b"), "replaced", 1, 2),
        Change(("m", "c"), "added", None, 2),
        Change(("q",), "added", None, 2),
    ]
    assert diff(old, new) == expected
    assert diff(json.loads(json.dumps(old)), json.loads(json.dumps(new))) == expected


@dataclass(frozen=True)
class Msg:
    role: str
    content: str


@dataclass
class DataState:
    messages: list[Msg]
    n: int


class ModelState(pydantic.BaseModel):
    messages: list[str]
    meta: dict[str, Any] = {}


def test_dataclass_and_pydantic_values_count_as_their_fields() -> None:
    a = DataState([Msg("user", "hi")], 1)
    b = DataState([Msg("user", "hi"), Msg("ai", "<hello>")], 2)
    assert diff(a, b) == [
        Change(("messages",), "appended", None, [Msg("ai", "<hello>")]),
        Change(("n",), "replaced", 1, 2),
    ]
    assert to_json(diff(a, b))[0]["new"] == [{"role": "ai", "content": "<hello>"}]
    assert diff(a, {"messages": [{"role": "user", "content": "hi"}], "n": 1}) == []
    assert diff({"m": Msg("user", "hi")}, {"m": Msg("user", "yo")}) == [
        Change(("m", "content"), "replaced", "hi", "yo")]
    pa = ModelState(messages=["a"])
    pb = ModelState(messages=["a", "b"], meta={"k": [1]})
    assert diff(pa, pb) == [
        Change(("messages",), "appended", None, ["b"]),
        Change(("meta", "k"), "added", None, [1]),
    ]
    assert diff(pa, {"messages": ["a"], "meta": {}}) == []


def test_a_tuple_and_a_list_of_the_same_items_are_equal() -> None:
    assert diff({"xs": (1, 2)}, {"xs": [1, 2]}) == []
    assert diff({"xs": (1, 2)}, {"xs": [1, 2, 3]}) == [Change(("xs",), "appended", None, [3])]


def test_nan_equals_nan() -> None:
    assert diff({"x": float("nan")}, {"x": float("nan")}) == []
    assert equal([float("nan")], [float("nan")])


def message(i: int) -> dict[str, str]:
    return {"role": "ai", "content": f"{i:04d}" + "x" * 1020}


@dataclass(eq=False)
class Counted:
    """A message whose ``==`` (Python code, like any dataclass's) counts its calls."""

    content: str
    calls: ClassVar[list[int]] = []

    def __eq__(self, other: object) -> bool:
        Counted.calls.append(1)
        return isinstance(other, Counted) and other.content == self.content

    __hash__ = None  # type: ignore[assignment]


@pytest.fixture
def equal_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the module's item-by-item comparisons."""
    calls: list[int] = []
    real = graphdiff._equal

    def counted(a: Any, b: Any) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(graphdiff, "_equal", counted)
    return calls


def test_a_long_list_sharing_its_items_is_not_compared_item_by_item(equal_calls: list[int]) -> None:
    """The new state of a super-step holds the old items themselves: no item
    is compared, neither by the diff nor by the items' own ``==`` (the
    identity scan runs at C speed)."""
    old_items = [Counted(f"{i:04d}" + "x" * 1020) for i in range(3000)]
    old = {"messages": old_items, "n": 3000}
    new = {"messages": [*old_items, Counted("new")], "n": 3001}
    Counted.calls.clear()
    changes = diff(old, new)
    assert (len(equal_calls), len(Counted.calls)) == (1, 0)  # 1: the field n
    assert [(c.path, c.kind) for c in changes] == [(("messages",), "appended"), (("n",), "replaced")]
    assert changes[0].new[0].content == "new"
    assert first_divergence([old, old], [old, new]) == 1


def test_a_long_list_of_equal_dicts_is_compared_at_c_speed(equal_calls: list[int]) -> None:
    old_items = [message(i) for i in range(3000)]
    copies = json.loads(json.dumps(old_items))
    assert diff({"messages": old_items}, {"messages": [*copies, message(3000)]}) == [
        Change(("messages",), "appended", None, [message(3000)])]
    assert len(equal_calls) == 0


def test_a_long_list_of_equal_copies_is_still_diffed_exactly() -> None:
    """States read back separately share no objects: the same answers, item by item."""
    items = [message(i) for i in range(3000)]
    old = json.loads(json.dumps({"messages": items}))
    grown = json.loads(json.dumps({"messages": [*items, message(3000)]}))
    assert diff(old, grown) == [Change(("messages",), "appended", None, [message(3000)])]
    changed = json.loads(json.dumps(grown))
    changed["messages"][1500]["content"] = "edited"
    assert diff(old, changed) == [
        Change(("messages",), "replaced", old["messages"], changed["messages"])]
    same_length = json.loads(json.dumps(old))
    same_length["messages"][2999]["role"] = "user"
    assert diff(old, same_length) == [Change(("messages", 2999, "role"), "replaced", "ai", "user")]
    texts = [m["content"] for m in items]
    assert diff({"m": texts}, {"m": [*json.loads(json.dumps(texts)), "new"]}) == [
        Change(("m",), "appended", None, ["new"])]
    shared_then_copied = [*texts[:100], *json.loads(json.dumps(texts[100:]))]
    shared_then_copied[2000] = "edited"
    assert diff({"m": texts}, {"m": shared_then_copied}) == [
        Change(("m", 2000), "replaced", texts[2000], "edited")]


def states(values: list[int], consumed: list[int]) -> Iterator[dict[str, int]]:
    for i, v in enumerate(values):
        consumed.append(i)
        yield {"n": v}


def test_first_divergence() -> None:
    assert first_divergence([], []) is None
    assert first_divergence([{"n": 1}, {"n": 2}], [{"n": 1}, {"n": 2}]) is None
    assert first_divergence([{"n": 1}, {"n": 2}, {"n": 3}], [{"n": 1}, {"n": 2}, {"n": 4}]) == 2
    assert first_divergence([{"n": 5}], [{"n": 6}]) == 0
    assert first_divergence([{"n": 1}, {"n": 2}], [{"n": 1}]) == 1  # one run ended
    assert first_divergence([], [{"n": 1}]) == 0


def test_first_divergence_reads_no_state_past_it() -> None:
    read_a: list[int] = []
    read_b: list[int] = []
    assert first_divergence(states([0, 1, 2, 3, 4, 5], read_a), states([0, 1, 9, 3, 4, 5], read_b)) == 2
    assert read_a == [0, 1, 2]
    assert read_b == [0, 1, 2]


def test_to_json_holds_every_kind() -> None:
    changes = diff({"a": 1, "xs": [1, 2], "ys": [1, 2, 3], "zs": [1, 3], "d": {0: (1, 2)}},
                   {"xs": [1, 2, 3], "ys": [1, 3], "zs": [1, 2, 3], "d": {0: (1, 2, 3)}, "b": None})
    data = to_json(changes)
    assert json.loads(json.dumps(data)) == data
    assert data == [
        {"path": ["a"], "kind": "removed", "old": 1, "new": None},
        {"path": ["xs"], "kind": "appended", "old": None, "new": [3]},
        {"path": ["ys", 1], "kind": "deleted", "old": [2], "new": None},
        {"path": ["zs", 1], "kind": "inserted", "old": None, "new": [2]},
        {"path": ["d", 0], "kind": "appended", "old": None, "new": [3]},
        {"path": ["b"], "kind": "added", "old": None, "new": None},
    ]
    assert {c["kind"] for c in data} | {"replaced"} == set(graphdiff.KINDS)
    assert to_json([Change(("v",), "replaced", {1: "a"}, {"k": (1, 2)})]) == [
        {"path": ["v"], "kind": "replaced", "old": {"1": "a"}, "new": {"k": [1, 2]}}]


def test_to_json_names_the_path_of_a_value_that_is_not_json() -> None:
    changes = diff({"v": {"s": [1]}}, {"v": {"s": [1, {1, 2}]}})
    message = r"^to_json: the value at \['v', 's', 0\] is a set, not a JSON value$"
    with pytest.raises(TypeError, match=message):
        to_json(changes)


def test_a_key_that_is_not_a_str_or_int_is_a_clear_error() -> None:
    message = r"^diff: the key \(1, 2\) at \['d'\] is a tuple, not a str or an int$"
    with pytest.raises(TypeError, match=message):
        diff({"d": {(1, 2): 1}}, {"d": {(1, 2): 2}})


def test_a_value_that_contains_itself_is_a_clear_error() -> None:
    a: list[Any] = []
    a.append(a)
    b: list[Any] = []
    b.append(b)
    assert diff({"x": a}, {"x": a}) == []
    with pytest.raises(ValueError, match="nests deeper than Python's recursion limit"):
        diff({"x": a}, {"x": b})
