"""What an edited value must look like: a type's JSON Schema, and the check.

An approval request is decided by someone who does not have the workflow's
code (``cairn approve`` on another machine, later an HTTP client), yet an
edit must fit the type the run will decode it into, and be refused *at
decision time*, before anything is stored. So the run records its type's
JSON Schema with the request (``schema_of``), and the decider checks the
edit against it (``check``) with ``jsonschema``, a library made for that.
The run still decodes the decision into the type itself (``values.decode``):
the schema is how a decider is told no early, never a substitute for it.

Schemas come from msgspec (dataclasses, Structs, TypedDicts, builtins) and
from pydantic for its models, the two ways the codec reads values.
"""

from __future__ import annotations

import sys
from typing import Any

import jsonschema
import msgspec
from referencing.exceptions import Unresolvable

from cairn.errors import PayloadError


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
        return msgspec.json.schema(type_, schema_hook=_hook)
    except (TypeError, NotImplementedError, ValueError) as exc:
        raise PayloadError(f"type {type_!r} has no JSON Schema, so an edit of it cannot be checked: {exc}") \
            from None


def type_name(type_: Any) -> str:
    """How a type is named to people deciding on a value of it."""
    if isinstance(type_, type):
        return type_.__qualname__ if type_.__module__ in ("builtins",) else \
            f"{type_.__module__}.{type_.__qualname__}"
    return repr(type_).replace("typing.", "")


def check(value: Any, schema: dict[str, Any], *, what: str) -> None:
    """``PayloadError`` naming ``what`` and the first problem unless the
    plain JSON ``value`` fits ``schema``."""
    try:
        validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator_class.check_schema(schema)  # a damaged stored schema is an error, never a crash or a pass
        validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except jsonschema.exceptions.SchemaError as exc:
        raise PayloadError(f"{what}: its schema is damaged ({exc.message})") from None
    except (Unresolvable, jsonschema.exceptions.UnknownType) as exc:
        raise PayloadError(f"{what}: its schema cannot be applied ({exc})") from None
    if error is not None:
        where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the value"
        raise PayloadError(f"{what}: {where}: {error.message}")
