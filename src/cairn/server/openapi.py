"""The OpenAPI 3.1 document of the API, generated from the route table
(``routing.Endpoint``) and the request types (msgspec structs, whose JSON
Schema msgspec writes), so it cannot drift from the routes.
``python -m cairn.server.openapi`` prints it; ``docs/openapi.json`` is that
output, checked in (a test compares the two)."""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

from cairn.server.routing import Endpoint, NoBody, NoQuery
from cairn.store.runids import ID_PATTERN

_ERROR = {"type": "object", "required": ["error", "message"],
          "properties": {"error": {"type": "string"}, "message": {"type": "string"}}}

_ERRORS = {
    "400": "Bad input (JSON error body)",
    "401": "No token, or an invalid or revoked one",
    "403": "The token's role does not allow this",
    "404": "No such run (or one of another tenant: the same answer)",
    "409": "The run's state does not allow this",
    "413": "The request body is too large",
    "422": "Well-formed but not acceptable (an unknown workflow, an edit that does not fit)",
    "503": "The store is unavailable",
}


_TEXT = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^\\x00-\\x1f\\x7f]+$"}
#: what each path parameter may be (any other text is refused with a 4xx)
_PATH: dict[str, dict[str, Any]] = {
    "run_id": {**_TEXT, "pattern": ID_PATTERN, "description": "percent-encoded ('/' as %2F)"},
    "name": {**_TEXT, "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$"},
    "key": {**_TEXT, "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$"},
    "request_id": _TEXT,
    "token_id": _TEXT,
    "position": {"type": "string", "pattern": "^[0-9]{1,18}$"},
    **{step: {"type": "string", "pattern": "^[0-9]{1,18}$", "description": "a super-step"}
       for step in ("step", "a", "b")},
}


def _query_parameters(kind: type[Any], components: dict[str, Any]) -> list[dict[str, Any]]:
    if kind is NoQuery:
        return []
    (schema,), extra = msgspec.json.schema_components([kind], ref_template="#/components/schemas/{name}")
    components.update(extra)
    resolved = extra[kind.__name__] if "$ref" in schema else schema
    required = set(resolved.get("required", ()))
    return [{"name": name, "in": "query", "required": name in required, "schema": prop}
            for name, prop in resolved.get("properties", {}).items()]


def _operation_id(spec: Endpoint) -> str:
    words = spec.path.strip("/").replace("{", "").replace("}", "").replace("-", "_").split("/")
    return "_".join([spec.method.lower(), *words])


def _success_schema(spec: Endpoint, components: dict[str, Any]) -> dict[str, Any]:
    if spec.media == "text/event-stream":  # each event: its fields, data a line of JSON
        return {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"},
                                                 "id": {"type": "string"}, "retry": {"type": "integer"}}}
    if spec.media != "application/json":  # text (the Prometheus exposition format)
        return {"type": "string"}
    if spec.response is not None:
        (schema,), extra = msgspec.json.schema_components([spec.response],
                                                          ref_template="#/components/schemas/{name}")
        components.update(extra)
        return schema
    return {"type": "object"}


def document(routes: list[Endpoint]) -> dict[str, Any]:
    components: dict[str, Any] = {"Error": _ERROR}
    paths: dict[str, dict[str, Any]] = {}
    for spec in routes:
        operation: dict[str, Any] = {
            "summary": spec.summary,
            "operationId": _operation_id(spec),
            "tags": [spec.tag],
            "security": [{"bearer": []}],
            "x-cairn-role": spec.role.value,
            "parameters": [*({"name": p, "in": "path", "required": True,
                              "schema": _PATH.get(p, {"type": "string"})} for p in spec.parameters),
                           *_query_parameters(spec.query, components)],
            "responses": {
                str(spec.status): {"description": spec.returns,
                                   "content": {spec.media: {"schema": _success_schema(spec, components)}}},
                **{code: {"description": text,
                          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
                   for code, text in _ERRORS.items()},
            },
        }
        if spec.stream is not None:
            operation["responses"]["429"] = {
                "description": "The token holds the most event streams one token may (close one)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            # a run's cursor is a seq; the tenant's is "<updated_at>/<run_id>"
            cursor = ({"type": "string", "pattern": "^[0-9]{0,18}$"} if "{run_id}" in spec.path else
                      {"type": "string", "maxLength": 400, "pattern": "^$|^[0-9]+(\\.[0-9]+)?/"})
            operation["parameters"].append({"name": "Last-Event-ID", "in": "header", "required": False,
                                            "schema": cursor})
            operation["parameters"].append({"name": "after", "in": "query", "required": False,
                                            "schema": cursor})
        if spec.idempotent:
            operation["parameters"].append({"name": "Idempotency-Key", "in": "header", "required": False,
                                            "schema": {"type": "string", "minLength": 1, "maxLength": 200,
                                                       "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$"}})
        if spec.body is not NoBody:
            (schema,), extra = msgspec.json.schema_components([spec.body],
                                                              ref_template="#/components/schemas/{name}")
            components.update(extra)
            # a body with a required field is required; an empty one reads as {}
            required = any(f.required for f in msgspec.structs.fields(spec.body))
            operation["requestBody"] = {"required": required,
                                        "content": {"application/json": {"schema": schema}}}
        paths.setdefault(spec.path, {})[spec.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Cairn", "version": "1",
                 "description": "Start, watch and operate durable agent runs. Every request carries a bearer "
                                "token bound to one tenant and one role (viewer, operator, admin, "
                                "installation)."},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": dict(sorted(components.items())),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def main() -> None:
    from cairn.server.routes import ROUTES

    sys.stdout.write(json.dumps(document(ROUTES), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
