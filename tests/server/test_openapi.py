"""The published OpenAPI document matches the routes: every route the
server answers is in it with its method and role, nothing else is, and the
checked-in ``docs/openapi.json`` is what the code generates."""

from __future__ import annotations

import json
from pathlib import Path

from starlette.routing import Route

import cairn
from cairn.server import ROUTES, create_app
from cairn.server.openapi import document

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_every_api_route_is_in_the_document_and_nothing_else() -> None:
    with cairn.App(db="memory://") as app:
        server = create_app(app)
        served = {(method, route.path) for route in server.routes if isinstance(route, Route)
                  and (route.path.startswith("/api/") or route.path == "/metrics")
                  and route.path != "/api/openapi.json"
                  for method in (route.methods or set()) - {"HEAD"}}
    spec = document(ROUTES)
    documented = {(method.upper(), path) for path, ops in spec["paths"].items() for method in ops}
    assert served == documented
    for endpoint in ROUTES:
        operation = spec["paths"][endpoint.path][endpoint.method.lower()]
        assert operation["x-cairn-role"] == endpoint.role.value
        assert {p["name"] for p in operation["parameters"] if p["in"] == "path"} == set(endpoint.parameters)
        for code in ("401", "403"):
            assert code in operation["responses"]


def test_the_checked_in_document_is_the_generated_one() -> None:
    assert json.loads(DOC.read_text("utf-8")) == json.loads(json.dumps(document(ROUTES))), \
        "docs/openapi.json is stale: python -m cairn.server.openapi > docs/openapi.json"


def test_the_server_publishes_it(tmp_path: Path) -> None:
    from .conftest import LiveServer

    with cairn.App(db=f"sqlite:///{tmp_path}/c.db") as app, LiveServer(app) as live:
        import httpx

        published = httpx.get(f"{live.url}/api/openapi.json").json()
    assert published["openapi"].startswith("3.1")
    assert published == json.loads(json.dumps(document(ROUTES)))
