"""Bundles and versions side by side, in one process: each deployment is an
App of its own on the same database (its own registry, as a separate worker
process would have)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

import cairn
from cairn.engine.bundles import Bundle, code_hash
from cairn.errors import UnknownWorkflow
from cairn.store.records import EventType, RunStatus
from tests.bundles import apps, flows
from tests.timing import NAP, wait_until_due

Deploy = Callable[[Callable[[str | None], cairn.App]], cairn.App]


def _drain(app: cairn.App, seconds: float = 1.0) -> cairn.Worker:
    worker = app.worker(concurrency=2, poll_interval=0.02, lease_seconds=1.0)
    worker.run(install_signals=False, max_idle=seconds)
    return worker


# -- what a bundle id is -------------------------------------------------------------------


def _wf_a(ctx: cairn.Context, x: int) -> int:
    """A docstring."""
    return x + 1  # a comment


def _wf_a_reformatted(ctx: cairn.Context, x: int) -> int:
    """Another docstring."""

    return (
        x + 1
    )


def _wf_a_changed(ctx: cairn.Context, x: int) -> int:
    return x + 2


def test_the_code_hash_ignores_comments_formatting_and_docstring_but_not_code() -> None:
    assert code_hash(_wf_a) == code_hash(_wf_a)  # stable
    assert code_hash(_wf_a_reformatted) == code_hash(_wf_a)
    assert code_hash(_wf_a_changed) != code_hash(_wf_a)
    assert code_hash(_wf_a).startswith("reach:")


def test_a_bundle_id_is_its_content_hash_and_changes_with_what_it_pins() -> None:
    base = Bundle.build("order", "1", "ast:x", {"p": "A"}, {"m": {"model": "m1"}}, [])
    again = Bundle.build("order", "1", "ast:x", {"p": "A"}, {"m": {"model": "m1"}}, [])
    assert again.bundle_id == base.bundle_id
    variants = [
        Bundle.build("order", "2", "ast:x", {"p": "A"}, {"m": {"model": "m1"}}, []),
        Bundle.build("order", "1", "ast:y", {"p": "A"}, {"m": {"model": "m1"}}, []),
        Bundle.build("order", "1", "ast:x", {"p": "B"}, {"m": {"model": "m1"}}, []),
        Bundle.build("order", "1", "ast:x", {"p": "A"}, {"m": {"model": "m2"}}, []),
        Bundle.build("order", "1", "ast:x", {"p": "A"}, {"m": {"model": "m1"}},
                     [{"name": "t", "effect": "read", "parameters": "()", "schema": "int"}]),
    ]
    assert len({v.bundle_id for v in variants} | {base.bundle_id}) == len(variants) + 1


def test_two_processes_with_the_same_registrations_agree_on_the_bundle(deploy: Deploy) -> None:
    one, two = deploy(apps.serving_both), deploy(apps.serving_both)
    assert {k: b.bundle_id for k, b in one.runtime.registry.local().items()} == \
        {k: b.bundle_id for k, b in two.runtime.registry.local().items()}


def test_tools_and_model_settings_are_part_of_the_bundle(deploy: Deploy) -> None:
    app = deploy(apps.serving_v1)
    before = app.runtime.registry.local()[("order", "1")]

    @app.tool(effect="read")
    def lookup(q: str) -> int:
        return len(q)

    with_tool = app.runtime.registry.local()[("order", "1")]
    app.model_settings("planner", model="gpt-4o-mini", temperature=0.2)
    with_model = app.runtime.registry.local()[("order", "1")]
    assert len({before.bundle_id, with_tool.bundle_id, with_model.bundle_id}) == 3
    assert [t["name"] for t in with_tool.tools] == ["lookup"]
    assert with_tool.tools[0]["effect"] == "read"
    assert with_model.models == {"planner": {"model": "gpt-4o-mini", "temperature": 0.2}}
    assert with_model.code == before.code  # the code did not change


# -- versions side by side --------------------------------------------------------------------


def test_start_takes_the_newest_version_or_the_pinned_one(deploy: Deploy) -> None:
    app = deploy(apps.serving_both)
    newest = app.start("order", 1, 0.0)
    pinned = app.start("order", 1, 0.0, version="1")
    local = app.runtime.registry.local()
    assert app.get_run(newest.run_id).bundle == local[("order", "2")].bundle_id
    assert app.get_run(pinned.run_id).workflow_version == "1"
    assert app.get_run(pinned.run_id).bundle == local[("order", "1")].bundle_id
    _drain(app)
    assert newest.result(timeout=5).startswith("v2 hello v2:0,v2:1,v2:2")
    assert pinned.result(timeout=5) == "v1 hello v1:0,v1:1"
    with pytest.raises(UnknownWorkflow, match="order version 7"):
        app.start("order", 1, 0.0, version="7")


def test_the_same_name_and_version_with_other_code_is_refused(deploy: Deploy) -> None:
    app = deploy(apps.serving_v1)
    with pytest.raises(ValueError, match="version '1' is already registered"):
        app.workflow(name="order", version="1")(flows.order_v1_drifted)
    app.workflow(name="order", version="1")(flows.order_v1)  # the same function again: fine


def test_v1_runs_wait_for_a_worker_serving_v1_and_finish_on_v1_code(deploy: Deploy) -> None:
    old = deploy(apps.serving_v1)
    runs = [old.start("order", 1, NAP) for _ in range(3)]
    _drain(old, 0.1)  # they run to their timers and suspend
    assert {old.get_run(r.run_id).status for r in runs} == {RunStatus.SUSPENDED}
    v1_bundle = old.get_run(runs[0].run_id).bundle
    wait_until_due(old, *(r.run_id for r in runs))
    old.close()

    new = deploy(apps.serving_v2)
    worker = _drain(new, 0.5)
    assert worker.claimed == 0  # v2-only workers never take a v1 run
    assert v1_bundle not in worker.bundles
    for run in runs:
        record = new.get_run(run.run_id)
        assert record.status is RunStatus.SUSPENDED
        waiting = new.operator.waiting_for_worker(record, now=time.time() + 60)
        assert waiting is not None
        assert f"waiting for a worker serving bundle {v1_bundle}" in waiting

    again = deploy(apps.serving_v1)
    _drain(again, 0.5)
    for run in runs:
        assert again.handle(run.run_id).result(timeout=5) == "v1 hello v1:0,v1:1"


def test_both_versions_served_each_run_on_its_own_code(deploy: Deploy) -> None:
    old, new = deploy(apps.serving_v1), deploy(apps.serving_v2)
    v1 = [old.start("order", 2, 0.1) for _ in range(2)]
    v2 = [new.start("order", 2, 0.1) for _ in range(2)]
    both = deploy(apps.serving_both)
    _drain(both, 1.0)
    for run in v1:
        assert both.handle(run.run_id).result(timeout=5) == "v1 hello v1:0,v1:1,v1:2"
    for run in v2:
        assert both.handle(run.run_id).result(timeout=5) == "v2 hello v2:0,v2:1,v2:2,v2:3"


def test_a_drifted_worker_refuses_the_bundle_and_says_why(
    deploy: Deploy, caplog: pytest.LogCaptureFixture
) -> None:
    good = deploy(apps.serving_v1)
    run = good.start("order", 1, 0.0)
    drifted = deploy(apps.drifted_v1)
    with caplog.at_level(logging.ERROR, logger="cairn.bundles"):
        worker = _drain(drifted, 0.3)
        _drain(drifted, 0.3)  # refused once, said once
    assert worker.claimed == 0
    bundle = good.get_run(run.run_id).bundle
    lines = [r.getMessage() for r in caplog.records if bundle and bundle in r.getMessage()]
    assert len(lines) == 1
    assert "code drift" in lines[0]
    assert "register the new code as a new version" in lines[0]
    assert good.get_run(run.run_id).status is RunStatus.PENDING
    _drain(good, 0.3)
    assert good.handle(run.run_id).result(timeout=5) == "v1 hello v1:0,v1:1"


def test_a_run_resumes_with_the_prompt_it_started_with(deploy: Deploy, db_url: str) -> None:
    first = deploy(apps.serving_v1)
    run = first.start("order", 1, NAP)
    _drain(first, 0.1)
    wait_until_due(first, run.run_id)
    later = cairn.App(db=db_url, lease_seconds=1.0)  # same code, another prompt
    try:
        later.prompt("greeting", "HIJACKED")
        later.workflow(name="order", version="1")(flows.order_v1)
        assert later.runtime.registry.local()[("order", "1")].bundle_id != first.get_run(run.run_id).bundle
        _drain(later, 0.5)
        assert later.handle(run.run_id).result(timeout=5) == "v1 hello v1:0,v1:1"
        fresh = later.start("order", 1, 0.0)
        _drain(later, 0.3)
        assert fresh.result(timeout=5) == "v1 HIJACKED v1:0,v1:1"
    finally:
        later.close()


def test_the_run_history_and_records_name_the_bundle(deploy: Deploy) -> None:
    app = deploy(apps.serving_v1)
    run = app.start("order", 0, 0.0)
    record = app.get_run(run.run_id)
    assert record.bundle is not None
    assert record.bundle.startswith("b")
    views = {v.bundle_id: v for v in app.bundles()}
    assert views[record.bundle].runs == {"pending": 1}
    assert views[record.bundle].prompts == ("greeting",)
    _drain(app, 0.2)
    assert {v.bundle_id: v for v in app.bundles()}[record.bundle].runs == {"completed": 1}
    assert app.history(run.run_id)[0].event is EventType.RUN_CREATED


def test_resuming_a_run_of_a_bundle_this_app_does_not_serve_is_an_error(deploy: Deploy) -> None:
    old = deploy(apps.serving_v1)
    run = old.start("order", 0, 0.0)
    new = deploy(apps.serving_v2)
    with pytest.raises(cairn.BundleNotServed, match="does not serve"):
        new.resume(run.run_id)
    assert new.get_run(run.run_id).status is RunStatus.PENDING  # given back, for a worker that serves it
    assert old.resume(run.run_id) == "v1 hello v1:0"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # edits the SQLite file itself
def test_a_damaged_bundle_row_is_refused_never_run(deploy: Deploy, db_url: str) -> None:
    import sqlite3

    from cairn.store import sqlite_path

    starter = deploy(apps.serving_v1)
    run = starter.start("order", 0, 0.0)
    bundle = starter.get_run(run.run_id).bundle
    starter.close()
    path = sqlite_path(db_url)
    assert path is not None
    with sqlite3.connect(path) as conn:  # someone edits the prompt the run pinned
        conn.execute("UPDATE bundles SET content = replace(content, 'hello', 'HACKD') WHERE bundle_id = ?",
                     (bundle,))
    # a worker with the same code and another prompt must read the pinned prompt from the row
    worker_app = deploy(lambda url: apps._app(url, prompt="other"))
    worker_app.workflow(name="order", version="1")(flows.order_v1)
    worker = _drain(worker_app, 0.3)
    assert worker.claimed == 0
    assert bundle not in worker.bundles
    assert worker_app.get_run(run.run_id).status is RunStatus.PENDING
    [view] = [v for v in worker_app.bundles() if v.bundle_id == bundle]
    assert view.damaged is not None
    assert "does not hash to its id" in view.damaged
