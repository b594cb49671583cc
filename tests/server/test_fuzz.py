"""Property-based fuzzing of the published OpenAPI document (schemathesis):
every operation, called in process on the ASGI app (no network) with a
valid admin token, on requests generated from the document, valid and not:
no answer is a 5xx, every answer conforms to the document (status, media
type, body schema), bad input is refused and good input accepted.

Generated run ids are random, so a few known ones are mixed in (one with a
'/' and one waiting for an approval) to reach the code behind the 404. The
tenant's event stream never ends by design, so it is the one operation left
out (``test_streams.py`` covers it). The example count is kept small so the
whole module runs in CI in well under a minute, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.server import create_app
from tests.engine.conftest import postgres_url

from .conftest import TENANT
from .workflows import drain, register

KNOWN = ["fuzz-echo", "fuzz/with slash", "fuzz-pay"]
EXAMPLES = 10
#: A request can fit the document and still be refused for what it means: a
#: workflow the server's app does not register, an edit that does not fit
#: the request's schema, an operation that is not uncertain (422, 409).
ACCEPTED = ["2xx", "401", "403", "404", "409", "422"]


@pytest.fixture(params=["sqlite", "postgres"])
def fuzzed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    if request.param == "postgres":  # its text refuses what SQLite's takes (NUL): both are fuzzed
        app = cairn.App(db=postgres_url(request.getfixturevalue("pg_url")), lease_seconds=5.0)
    else:
        app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db", lease_seconds=5.0)
    wf = register(app)
    token = app.tokens.mint(TENANT, "admin", "fuzzer").secret
    app.start(wf["echo"], "hello", tenant=TENANT, run_id=KNOWN[0])
    app.start(wf["listener"], tenant=TENANT, run_id=KNOWN[1])
    app.start(wf["payout"], "ada", 5, tenant=TENANT, run_id=KNOWN[2])
    drain(app)
    yield create_app(app, heartbeat=0.2), token
    app.close()


def test_the_api_conforms_and_never_fails(fuzzed: tuple[Any, str]) -> None:
    # imported here, not at the top: schemathesis and hypothesis cost two seconds of CPU in
    # every process that collects the suite, and only this test uses them (the dev extra has both)
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    config = schemathesis.config.SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}}})
    asgi, token = fuzzed
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", asgi, config=config)
    schema = schema.exclude(path="/api/events")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 25
    for operation in operations:
        # a stream of a run that has not ended never ends: only the finished run's
        known_runs = KNOWN[:1] if operation.path.endswith("/events") else KNOWN

        @given(case=operation.as_strategy(), known=st.sampled_from([None, *known_runs]))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case: Any, known: str | None) -> None:
            if known is not None and "run_id" in (case.path_parameters or {}):
                case.path_parameters["run_id"] = known
            case.call_and_validate(headers={"Authorization": f"Bearer {token}"})

        fuzz()
