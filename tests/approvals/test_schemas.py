"""``cairn.codec.schemas``: the JSON Schema an edit is checked against when it
is made, for the kinds of types the codec decodes (dataclasses, Structs,
pydantic models, builtins, ``Any``), and the one-line errors it gives."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import msgspec
import pydantic
import pytest

from cairn.codec import schemas, values
from cairn.errors import PayloadError


@dataclasses.dataclass
class Line:
    sku: str
    qty: int = 1


class Order(msgspec.Struct, forbid_unknown_fields=True):
    lines: list[Line]
    priority: Literal["low", "high"]
    cents: Annotated[int, msgspec.Meta(ge=0, le=100_000)]


class Customer(pydantic.BaseModel):
    name: str
    vip: bool = False


@pytest.mark.parametrize(("type_", "good", "bad", "problem"), [
    (Line, {"sku": "a"}, {"qty": 2}, "'sku' is a required property"),
    (Order, {"lines": [{"sku": "a", "qty": 3}], "priority": "low", "cents": 5},
     {"lines": [], "priority": "urgent", "cents": 5}, "'urgent' is not one of"),
    (Order, {"lines": [], "priority": "high", "cents": 100_000},
     {"lines": [], "priority": "high", "cents": 100_001}, "is greater than the maximum"),
    (Order, {"lines": [], "priority": "high", "cents": 1},
     {"lines": [], "priority": "high", "cents": 1, "extra": 1}, "Additional properties"),
    # a dataclass (and a TypedDict, a Struct without forbid_unknown_fields) drops a key it does not
    # name when decoded: the edit's change would be lost silently, so the schema refuses the key
    (Line, {"sku": "a"}, {"sku": "a", "qyt": 2}, "'qyt' was unexpected"),
    (Customer, {"name": "ada"}, {"name": 3}, "3 is not of type 'string'"),
    (int, 3, "3", "'3' is not of type 'integer'"),
    (dict[str, int], {"a": 1}, {"a": "b"}, "['a']"),
])
def test_what_fits_the_type_fits_its_schema(type_: Any, good: Any, bad: Any, problem: str) -> None:
    schema = schemas.schema_of(type_)
    schemas.check(good, schema, what="the edit")
    values.decode(values.encode(good), type_)  # and the type itself takes it
    with pytest.raises(PayloadError, match=r"^the edit: ") as info:
        schemas.check(bad, schema, what="the edit")
    assert problem in str(info.value)
    assert "\n" not in str(info.value)


def test_any_takes_anything() -> None:
    for value in (None, 1, "x", [1], {"a": [None]}):
        schemas.check(value, schemas.schema_of(Any), what="the edit")


def test_a_damaged_schema_is_an_error_not_a_pass() -> None:
    with pytest.raises(PayloadError, match="damaged"):
        schemas.check({"a": 1}, {"type": 12}, what="the edit")


def test_type_names() -> None:
    assert schemas.type_name(int) == "int"
    assert schemas.type_name(Line) == f"{__name__}.Line"
    assert schemas.type_name(dict[str, int]) == "dict[str, int]"
