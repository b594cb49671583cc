"""A tool's access rule is pinned in the run's bundle: changing who may
call a tool is a bundle change, so a run is authorized by the rule it
started under. A worker whose rule differs (here: looser) does not serve
the run's bundle (tool drift, said once); one with the same rule serves it
and refuses the call. SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

import cairn
from cairn.engine.bundles import tool_fingerprint
from cairn.store.records import RunStatus

Deploy = Callable[[Callable[[str | None], cairn.App]], cairn.App]

#: the deployment's tool, as the workflow reaches it (state, not code: the code hash ignores it)
_TOOLS: dict[str, Any] = {}
_DROPPED: list[str] = []


def _drop(name: str) -> str:
    _DROPPED.append(name)
    return f"dropped {name}"


def cleanup(ctx: cairn.Context, name: str) -> str:
    return str(_TOOLS["drop"](name))


def deployment(access: cairn.ToolAccess | None) -> Callable[[str | None], cairn.App]:
    def build(db_url: str | None) -> cairn.App:
        app = cairn.App(db=db_url, lease_seconds=5.0)
        _TOOLS["drop"] = app.tool(name="drop_table", effect="write", access=access)(_drop)
        app.workflow(name="cleanup")(cleanup)
        return app

    return build


def _drain(app: cairn.App, seconds: float) -> cairn.Worker:
    worker = app.worker(concurrency=1, poll_interval=0.02, lease_seconds=1.0)
    worker.run(install_signals=False, max_idle=seconds)
    return worker


def test_a_changed_access_rule_is_a_new_bundle_and_the_old_runs_keep_theirs(
    deploy: Deploy, caplog: pytest.LogCaptureFixture
) -> None:
    _DROPPED.clear()
    strict = deploy(deployment(cairn.ToolAccess(role="admin")))
    run = strict.start("cleanup", "users", started_role="viewer", started_token="tv")
    bundle = strict.get_run(run.run_id).bundle
    assert bundle is not None
    [pinned] = strict.runtime.registry.load(bundle, strict.store).tools
    assert pinned["access"] == {"tenants": None, "workflows": None, "role": "admin"}
    strict.close()

    loose = deploy(deployment(cairn.ToolAccess(role="viewer")))
    assert loose.runtime.registry.bundle_for(loose.definition("cleanup"), loose.store).bundle_id != bundle
    with caplog.at_level(logging.ERROR, logger="cairn.bundles"):
        worker = _drain(loose, 0.3)
    assert worker.claimed == 0
    assert loose.get_run(run.run_id).status is RunStatus.PENDING
    [said] = [r.getMessage() for r in caplog.records if bundle in r.getMessage()]
    assert "tool drift" in said
    assert "access" in said
    assert _DROPPED == []
    loose.close()

    again = deploy(deployment(cairn.ToolAccess(role="admin")))  # the rule it started under
    _drain(again, 0.3)
    with pytest.raises(cairn.RunFailed, match=r"started as viewer \(token tv\) may not call it"):
        again.handle(run.run_id).result(timeout=5)
    assert _DROPPED == []


def test_a_tool_without_a_rule_pins_what_it_pinned_before() -> None:
    plain = tool_fingerprint("t", "read", "(x: int)", int)
    assert "access" not in plain
    rule = cairn.ToolAccess(tenants=frozenset({"b", "a"}))
    ruled = tool_fingerprint("t", "read", "(x: int)", int, rule.pinned())
    assert ruled == {**plain, "access": {"tenants": ["a", "b"], "workflows": None, "role": None}}
