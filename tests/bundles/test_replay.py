"""Patches, the replay check, migration and exports (SQLite and PostgreSQL).

Each deployment is an App of its own on the test's database: the code that
recorded a run, and the new code a check or a migration replays it on."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import cairn
from cairn.engine.definitions import StepDef
from cairn.engine.steps import Step
from cairn.errors import InvalidArgument, InvalidRunState, MigrationRefused, ReplayDivergence
from cairn.retry import NO_RETRY
from cairn.store.records import EventType, RunStatus
from tests.timing import NAP, wait_until_due

EXECUTED: list[str] = []


def _body(name: str) -> Callable[[], str]:
    def body() -> str:
        EXECUTED.append(name)
        return name

    return body


a, b, c, d, x = (Step(StepDef.build(_body(n), n, NO_RETRY)) for n in ("a", "b", "c", "d", "x"))


def recorded(ctx: cairn.Context) -> str:
    return "".join([a(), b(), c()])


def compatible(ctx: cairn.Context) -> str:
    return "-".join([a(), b(), c()]).upper()  # other code, the same journaled calls


def reordered(ctx: cairn.Context) -> str:
    return "".join([b(), a(), c()])


def renamed(ctx: cairn.Context) -> str:
    return "".join([a(), x(), c()])


def removed(ctx: cairn.Context) -> str:
    return "".join([a(), c()])


def added(ctx: cairn.Context) -> str:
    return "".join([a(), x(), b(), c()])


def truncated(ctx: cairn.Context) -> str:
    return "".join([a(), b()])


def extended(ctx: cairn.Context) -> str:
    return "".join([a(), b(), c(), d()])


def _deployment(db_url: str, fn: Callable[..., str], version: str) -> cairn.App:
    app = cairn.App(db=db_url, lease_seconds=1.0)
    app.workflow(name="flow", version=version)(fn)
    return app


@pytest.fixture
def code(db_url: str) -> Callable[[Callable[..., str], str], cairn.App]:
    opened: list[cairn.App] = []

    def make(fn: Callable[..., str], version: str = "2") -> cairn.App:
        app = _deployment(db_url, fn, version)
        opened.append(app)
        return app

    yield make  # type: ignore[misc]
    for app in opened:
        app.close()


def _finished_run(code: Callable[[Callable[..., str], str], cairn.App]) -> tuple[cairn.App, str]:
    app = code(recorded, "1")
    handle = app.start("flow")
    app.worker(poll_interval=0.02).run(install_signals=False, max_idle=0.2)
    assert handle.result(timeout=5) == "abc"
    return app, handle.run_id


@pytest.mark.parametrize(("new", "position", "recorded_call", "requested_call"), [
    (reordered, 0, "step 'a'", "step 'b'"),
    (renamed, 1, "step 'b'", "step 'x'"),
    (removed, 1, "step 'b'", "step 'c'"),
    (added, 1, "step 'b'", "step 'x'"),
    (truncated, 2, "step 'c'", "nothing"),
])
def test_the_replay_check_reports_the_first_divergence(
    code: Callable[[Callable[..., str], str], cairn.App], new: Callable[..., str], position: int,
    recorded_call: str, requested_call: str,
) -> None:
    app, run_id = _finished_run(code)
    history_before = app.history(run_id)
    EXECUTED.clear()
    report = code(new).replay_check(run_id)
    assert not report.compatible
    assert report.position == position
    assert report.recorded is not None
    assert report.recorded.startswith(recorded_call)
    assert report.requested is not None
    assert report.requested.startswith(requested_call)
    assert f"diverges at position {position}" in report.describe()
    assert EXECUTED == []  # no step ran
    assert app.history(run_id) == history_before  # nothing written


@pytest.mark.parametrize("new", [compatible, extended])
def test_a_compatible_change_passes_the_replay_check(
    code: Callable[[Callable[..., str], str], cairn.App], new: Callable[..., str]
) -> None:
    _, run_id = _finished_run(code)
    EXECUTED.clear()
    report = code(new).replay_check(run_id)
    assert report.compatible, report.describe()
    assert report.describe().startswith(f"run {run_id}: compatible")
    assert EXECUTED == []


def test_a_replay_check_of_a_thousand_step_journal(db_url: str) -> None:
    """A long journal checks through (its speed is measured in bench/bundles.py)."""
    app = cairn.App(db=db_url)
    try:
        @app.workflow(name="long")
        def long(ctx: cairn.Context) -> int:
            return sum(len(a()) for _ in range(1000))

        assert app.run(long) == 1000
        [run] = app.list_runs(workflow="long")
        report = app.replay_check(run.run_id)
        assert report.compatible
        assert report.replayed == 1000
    finally:
        app.close()


# -- patches --------------------------------------------------------------------------------


def before_fix(ctx: cairn.Context, pause: float) -> str:
    first = a()
    ctx.sleep(pause)
    return first + b()


def with_fix(ctx: cairn.Context, pause: float) -> str:
    first = a()
    if ctx.patched("fix-timeout"):
        first += c()
    ctx.sleep(pause)
    return first + b()


def fix_deprecated(ctx: cairn.Context, pause: float) -> str:
    first = a()
    ctx.deprecate_patch("fix-timeout")
    first += c()
    ctx.sleep(pause)
    return first + b()


def _drain(app: cairn.App, seconds: float = 0.3) -> None:
    app.worker(poll_interval=0.02).run(install_signals=False, max_idle=seconds)


def test_patched_is_false_on_replay_of_runs_past_it_and_true_for_new_progress(
    code: Callable[[Callable[..., str], str], cairn.App],
) -> None:
    old = code(before_fix, "1")
    old_run = old.start("flow", NAP)
    _drain(old, 0.1)
    assert old.get_run(old_run.run_id).status is RunStatus.SUSPENDED  # passed the patch point: at its timer
    new = code(with_fix, "2")
    report = new.replay_check(old_run.run_id)
    assert report.compatible, report.describe()
    new.migrate(old_run.run_id)
    fresh = new.start("flow", 0.0)
    wait_until_due(new, old_run.run_id)
    _drain(new, 0.3)
    assert new.handle(old_run.run_id).result(timeout=5) == "ab"  # the old branch, replayed exactly
    assert fresh.result(timeout=5) == "acb"  # the new one
    markers = [e for e in new.history(fresh.run_id) if e.step_kind == "patch"]
    assert [(m.position, m.name) for m in markers] == [(1, "fix-timeout")]
    assert not [e for e in new.history(old_run.run_id) if e.step_kind == "patch"]
    # a run that recorded the marker replays the new branch again
    again = new.replay_check(fresh.run_id, bundle=new.get_run(fresh.run_id).bundle)
    assert again.compatible
    assert again.replayed == 5  # a, the marker, c, the timer and b
    # once the old branch is gone, deprecate_patch keeps marked journals lined up
    assert code(fix_deprecated, "3").replay_check(fresh.run_id).compatible


def test_a_patch_marker_is_journaled_once_per_run(db_url: str) -> None:
    app = _deployment(db_url, with_fix, "1")
    try:
        assert app.run("flow", 0.0) == "acb"
        [run] = app.list_runs(workflow="flow")
        assert app.resume(run.run_id) == "acb"
        assert [e.name for e in app.history(run.run_id) if e.step_kind == "patch"] == ["fix-timeout"]
    finally:
        app.close()


# -- migration ------------------------------------------------------------------------------


def slow_recorded(ctx: cairn.Context, pause: float) -> str:
    first = a() + b()
    ctx.sleep(pause)
    return first + c()


def slow_reordered(ctx: cairn.Context, pause: float) -> str:
    first = b() + a()
    ctx.sleep(pause)
    return first + c()


def slow_compatible(ctx: cairn.Context, pause: float) -> str:
    first = a() + b()
    ctx.sleep(pause)
    return (first + c()).upper()


def _suspended(code: Callable[[Callable[..., str], str], cairn.App]) -> tuple[cairn.App, str]:
    old = code(slow_recorded, "1")
    handle = old.start("flow", NAP)
    _drain(old, 0.1)
    assert old.get_run(handle.run_id).status is RunStatus.SUSPENDED
    return old, handle.run_id


def _migrated_entries(app: cairn.App, run_id: str) -> list[dict[str, object]]:
    return [e.detail or {} for e in app.history(run_id) if e.event is EventType.RUN_MIGRATED]


def test_migrate_moves_a_compatible_run_and_the_history_shows_it(
    code: Callable[[Callable[..., str], str], cairn.App],
) -> None:
    old, run_id = _suspended(code)
    before = old.get_run(run_id)
    journal = [e for e in old.history(run_id) if e.position is not None]
    new = code(slow_compatible, "2")
    target = new.runtime.registry.local()[("flow", "2")].bundle_id
    report, after = new.migrate(run_id, target)
    assert report.compatible
    assert after.bundle == target
    assert after.workflow_version == "2"
    assert after.status is before.status
    [entry] = _migrated_entries(new, run_id)
    assert entry["from_bundle"] == before.bundle
    assert entry["to_bundle"] == target
    assert entry["actor"] == f"app:{__import__('os').getpid()}"
    assert entry["forced"] is False
    assert [e for e in new.history(run_id) if e.position is not None] == journal  # the journal stays
    wait_until_due(new, run_id)
    _drain(new, 0.3)
    assert new.handle(run_id).result(timeout=5) == "ABC"  # it finished on the new code


def test_migrate_refuses_a_run_whose_journal_diverges_unless_forced_with_a_reason(
    code: Callable[[Callable[..., str], str], cairn.App],
) -> None:
    old, run_id = _suspended(code)
    new = code(slow_reordered, "2")
    target = new.runtime.registry.local()[("flow", "2")].bundle_id
    with pytest.raises(MigrationRefused, match="diverges at position 0"):
        new.migrate(run_id, target)
    assert new.get_run(run_id).bundle == old.get_run(run_id).bundle
    assert _migrated_entries(new, run_id) == []
    with pytest.raises(InvalidArgument, match="needs a reason"):
        new.migrate(run_id, target, force=True)
    with pytest.raises(InvalidArgument, match="needs a reason"):
        new.migrate(run_id, target, force=True, reason="  ")
    operator = new.operator.acting_as("cli:security@host")
    report, after = new.migrate(run_id, target, force=True, reason="CVE-2026-0001", operator=operator)
    assert not report.compatible
    assert after.bundle == target
    [entry] = _migrated_entries(new, run_id)
    assert entry["forced"] is True
    assert entry["reason"] == "CVE-2026-0001"
    assert entry["actor"] == "cli:security@host"
    assert "diverges at position 0" in str(entry["check"])


def test_migrate_refuses_running_finished_and_foreign_targets(
    code: Callable[[Callable[..., str], str], cairn.App],
) -> None:
    _, run_id = _suspended(code)
    new = code(slow_compatible, "2")
    target = new.runtime.registry.local()[("flow", "2")].bundle_id
    with pytest.raises(InvalidArgument, match="not served by this app's code"):
        new.migrate(run_id, "b000000000000000000000000")
    other = cairn.App(db=new.db_url)
    try:
        other.workflow(name="other")(slow_compatible)
        foreign = other.runtime.registry.local()[("other", "1")].bundle_id
        other.start("other", 0.0)  # stores its bundle
        with pytest.raises(InvalidArgument, match="not of run"):
            other.migrate(run_id, foreign)
    finally:
        other.close()
    wait_until_due(new, run_id)
    claim = new.store.claim_run(run_id, "holder", 30.0, 5)
    assert claim is not None
    with pytest.raises(InvalidRunState, match="is running"):
        new.migrate(run_id, target)


# -- exports and cairn.testing.replay ----------------------------------------------------------


def test_an_export_replays_in_a_test_suite_and_fails_when_code_diverges(
    code: Callable[[Callable[..., str], str], cairn.App], tmp_path: Path,
) -> None:
    app, run_id = _finished_run(code)
    document = app.export_run(run_id)
    assert document["format"] == "cairn.run/1"
    assert document["run"]["result"] == "abc"
    assert document["bundle"]["id"] == app.get_run(run_id).bundle
    assert [e["position"] for e in document["history"] if e["event"] == "step.completed"] == [0, 1, 2]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    elsewhere = cairn.App(db=f"sqlite:///{tmp_path}/elsewhere.db")  # the test suite's own app: no runs
    try:
        elsewhere.workflow(name="flow", version="1")(recorded)
        assert cairn.testing.replay(elsewhere, path).compatible
    finally:
        elsewhere.close()
    changed = code(renamed)
    with pytest.raises(ReplayDivergence, match="diverges at position 1: recorded step 'b'"):
        cairn.testing.replay(changed, path)
    with pytest.raises(AssertionError):  # what a test suite reports as a failure
        cairn.testing.replay(changed, str(path))


@pytest.mark.parametrize(("content", "problem"), [
    ("not json", "is not JSON"),
    ('{"format": "cairn.run/0"}', "is not a run export of format"),
    ('[1, 2]', "is not a run export of format"),
    ('{"format": "cairn.run/1", "run": {}}', "is not a valid run export"),
])
def test_a_damaged_export_is_one_line(tmp_path: Path, content: str, problem: str, db_url: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    app = _deployment(db_url, recorded, "1")
    try:
        with pytest.raises(InvalidArgument, match=problem) as info:
            cairn.testing.replay(app, path)
        assert "\n" not in str(info.value)
        with pytest.raises(InvalidArgument, match="cannot read"):
            cairn.testing.replay(app, tmp_path / "missing.json")
    finally:
        app.close()


# -- a check that is stale by the time of the move ---------------------------------------------


def twice_recorded(ctx: cairn.Context, pause: float) -> str:
    first = a()
    ctx.sleep(pause)
    first += b()
    ctx.sleep(600.0)
    return first + c()


def twice_new(ctx: cairn.Context, pause: float) -> str:  # lines up with the journal up to the first timer
    first = a()
    ctx.sleep(pause)
    first += x()
    ctx.sleep(600.0)
    return first + c()


def test_migrate_commits_only_on_the_journal_it_checked(
    code: Callable[[Callable[..., str], str], cairn.App], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run wakes and records ``b`` between the check (which saw only
    ``a`` and the timer, compatible) and the move: the move must not commit
    on a check of a journal that is no longer the run's."""
    from cairn.engine import replaycheck
    from tests.acceptance.harness import wait_until

    old = code(twice_recorded, "1")
    handle = old.start("flow", NAP)  # suspends, however slow the commit of its deadline
    _drain(old, 0.1)
    assert old.get_run(handle.run_id).status is RunStatus.SUSPENDED
    new = code(twice_new, "2")
    real_check = replaycheck.check

    def check_then_the_run_moves_on(*args: object, **kwargs: object) -> replaycheck.ReplayReport:
        report = real_check(*args, **kwargs)  # type: ignore[arg-type]
        wait_until(lambda: (_drain(old, 0.05), [e for e in old.history(handle.run_id) if e.name == "b"])[1],
                   30, "the run to wake and record b")
        return report

    monkeypatch.setattr(replaycheck, "check", check_then_the_run_moves_on)
    before = old.get_run(handle.run_id)
    assert before.status is RunStatus.SUSPENDED
    with pytest.raises(InvalidRunState, match="its journal changed since the replay check"):
        new.migrate(handle.run_id)
    after = new.get_run(handle.run_id)
    assert after.status is RunStatus.SUSPENDED  # at its second timer
    assert after.bundle == before.bundle
    assert _migrated_entries(new, handle.run_id) == []
    monkeypatch.setattr(replaycheck, "check", real_check)
    with pytest.raises(MigrationRefused, match="diverges at position 2"):  # checked again: the truth
        new.migrate(handle.run_id)
