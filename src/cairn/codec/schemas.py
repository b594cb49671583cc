"""What an edited value must look like: a type's JSON Schema, and the check.

An approval request is decided by someone who does not have the workflow's
code (``cairn approve`` on another machine, later an HTTP client), yet an
edit must fit the type the run will decode it into, and be refused *at
decision time*, before anything is stored. So the run records its type's
JSON Schema with the request (``schema_of``), and the decider checks the
edit against it (``check``) with ``jsonschema``, a library made for that.
The run still decodes the decision into the type itself (``values.decode``):
the schema is how a decider is told no early, never a substitute for it.

JSON Schema says less than the type for the values msgspec reads from
strings: a ``datetime`` is any string to it ("next tuesday"), a ``Decimal``
a string of any ``format`` (``jsonschema`` checks no "decimal"), an ``int``
admits ``1.0``. An edit the schema admitted but the type refuses would be
stored as the decision and fail the run, past help from a retry or a new
decision. So each such leaf of the schema also names what the run will decode
it as (``x-cairn-decodes``), and ``check`` decodes the edit's value there with
the codec's own rules (``values.decode``): refused where the edit is made.

Schemas come from msgspec (dataclasses, Structs, TypedDicts, builtins) and
from pydantic for its models, the two ways the codec reads values.
"""

from __future__ import annotations

import datetime
import decimal
import sys
import uuid
from typing import Annotated, Any

import msgspec
import msgspec._json_schema as msgspec_schema
import msgspec.inspect as mi

from cairn.codec import values
from cairn.errors import PayloadError

#: the schema keyword naming what a leaf is decoded as (see the module's doc)
DECODES = "x-cairn-decodes"

#: what each ``DECODES`` name decodes into: the type the run reads the leaf as
_DECODED: dict[str, Any] = {
    "datetime": datetime.datetime,
    "datetime-tz": Annotated[datetime.datetime, msgspec.Meta(tz=True)],
    "datetime-naive": Annotated[datetime.datetime, msgspec.Meta(tz=False)],
    "time": datetime.time,
    "time-tz": Annotated[datetime.time, msgspec.Meta(tz=True)],
    "time-naive": Annotated[datetime.time, msgspec.Meta(tz=False)],
    "date": datetime.date,
    "timedelta": datetime.timedelta,
    "uuid": uuid.UUID,
    "decimal": decimal.Decimal,
    "bytes": bytes,
    "int": int,
}


def _pydantic_schema(type_: Any) -> dict[str, Any] | None:
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(type_, type) and issubclass(type_, pydantic.BaseModel):
        schema: dict[str, Any] = type_.model_json_schema()  # type: ignore[attr-defined]
        return schema
    return None


def _hook(type_: Any) -> dict[str, Any]:
    found = _pydantic_schema(type_)
    if found is None:
        raise NotImplementedError
    return found


def schema_of(type_: Any) -> dict[str, Any]:
    """The JSON Schema of the values that decode into ``type_`` (``{}``, any
    value, for ``Any``); ``PayloadError`` for a type that has none."""
    found = _pydantic_schema(type_)
    if found is not None:
        return found
    try:
        return _strict_schema(type_)
    except (TypeError, NotImplementedError, ValueError) as exc:
        raise PayloadError(f"type {type_!r} has no JSON Schema, so an edit of it cannot be checked: {exc}") \
            from None


def _decodes(t: mi.Type) -> str | None:
    """The ``DECODES`` name of a leaf msgspec reads from a JSON string (or an
    ``int``, which JSON Schema's ``integer`` does not tell from ``1.0``)."""
    if isinstance(t, (mi.DateTimeType, mi.TimeType)):
        base = "datetime" if isinstance(t, mi.DateTimeType) else "time"
        return base if t.tz is None else f"{base}-tz" if t.tz else f"{base}-naive"
    leaves: tuple[tuple[type[mi.Type], str], ...] = (
        (mi.DateType, "date"), (mi.TimeDeltaType, "timedelta"), (mi.UUIDType, "uuid"),
        (mi.DecimalType, "decimal"), (mi.BytesType, "bytes"), (mi.ByteArrayType, "bytes"),
        (mi.IntType, "int"))
    return next((name for kind, name in leaves if isinstance(t, kind)), None)


#: the types whose fields are named: an edit's key they do not name is refused (msgspec would drop it
#: silently when the run decodes the edit, so the decider's change would be lost without a word)
_NAMED_FIELDS = (mi.TypedDictType, mi.DataclassType, mi.StructType)


class _Strict(msgspec_schema._SchemaGenerator):
    """msgspec's schema generator, each leaf marked with what it decodes as,
    and an object of named fields closed to keys it does not name."""

    def to_schema(self, t: mi.Type, check_ref: bool = True) -> dict[str, Any]:
        schema: dict[str, Any] = super().to_schema(t, check_ref)
        while isinstance(t, mi.Metadata):
            t = t.type
        if isinstance(t, _NAMED_FIELDS) and "properties" in schema:
            schema.setdefault("additionalProperties", False)
        name = _decodes(t)
        if name is not None:
            schema[DECODES] = name
        return schema


def _strict_schema(type_: Any) -> dict[str, Any]:
    """``msgspec.json.schema(type_)`` with ``DECODES`` marks (its own steps,
    with the generator above)."""
    (info,) = mi.multi_type_info((type_,))
    components = msgspec_schema._collect_component_types((info,))
    names = msgspec_schema._build_name_map(components)
    generator = _Strict(names, _hook, msgspec_schema._REF_TEMPLATE)
    out = generator.to_schema(info)
    defs = {names[cls]: generator.to_schema(t, False) for cls, t in components.items()}
    if defs:
        out["$defs"] = defs
    return out


def _decodes_as(validator: Any, name: Any, instance: Any, schema: Any) -> Any:
    """The ``DECODES`` keyword: the value decodes as the type the run reads it as."""
    import jsonschema  # here, not at the top: ``import cairn`` need not pay for it (0.06 s of CPU)

    decoded = _DECODED.get(name) if isinstance(name, str) else None
    if decoded is None:  # written by a newer version, or damaged: the rest of the schema still holds
        return
    if decoded is int:
        if isinstance(instance, float):  # JSON Schema's integer admits 1.0; msgspec's int does not
            yield jsonschema.exceptions.ValidationError(f"{instance!r} is not an integer")
        return
    if not isinstance(instance, str):  # a Decimal's number, or what ``type`` refuses and says
        return
    try:
        values.decode(msgspec.json.encode(instance), decoded, what="value")
    except (PayloadError, ValueError) as exc:  # ValueError: text no JSON holds (a lone surrogate)
        reason = str(exc).split(": ", 1)[-1]
        yield jsonschema.exceptions.ValidationError(f"{instance!r} is not a valid {name} ({reason})")


def type_name(type_: Any) -> str:
    """How a type is named to people deciding on a value of it."""
    if isinstance(type_, type):
        return type_.__qualname__ if type_.__module__ in ("builtins",) else \
            f"{type_.__module__}.{type_.__qualname__}"
    return repr(type_).replace("typing.", "")


def check(value: Any, schema: dict[str, Any], *, what: str) -> None:
    """``PayloadError`` naming ``what`` and the first problem unless the
    plain JSON ``value`` fits ``schema``."""
    import jsonschema  # here, not at the top: only an approval edit is checked against a schema
    from referencing.exceptions import Unresolvable

    try:
        validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator_class.check_schema(schema)  # a damaged stored schema is an error, never a crash or a pass
        strict = jsonschema.validators.extend(validator_class, {DECODES: _decodes_as})  # type: ignore[no-untyped-call]
        validator = strict(schema, format_checker=validator_class.FORMAT_CHECKER)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except jsonschema.exceptions.SchemaError as exc:
        raise PayloadError(f"{what}: its schema is damaged ({exc.message})") from None
    except (Unresolvable, jsonschema.exceptions.UnknownType) as exc:
        raise PayloadError(f"{what}: its schema cannot be applied ({exc})") from None
    if error is not None:
        where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the value"
        raise PayloadError(f"{what}: {where}: {error.message}")
