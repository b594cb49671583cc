"""Declaring schedules on an App: what is accepted, and every bad input
refused at declaration with one line naming the schedule and the problem
(``cairn.InvalidSchedule``), with nothing registered."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

import cairn


@pytest.fixture
def app() -> Iterator[cairn.App]:
    application = cairn.App("memory://")

    @application.workflow(name="report")
    def report(ctx: cairn.Context, topic: str, at: datetime | None = None) -> str:
        return topic

    yield application
    application.close()


def test_the_decorator_form_returns_the_workflow(app: cairn.App) -> None:
    @app.schedule("0 8 * * *", timezone="Europe/Paris", tenant="acme")
    @app.workflow(name="digest")
    def digest(ctx: cairn.Context) -> str:
        return "ok"

    assert isinstance(digest, cairn.Workflow)
    schedule = app.runtime.schedules[("acme", "digest")]
    assert isinstance(schedule, cairn.Schedule)
    assert (schedule.timetable.cron, schedule.timetable.timezone, schedule.missed, schedule.grace) == (
        "0 8 * * *", "Europe/Paris", "once", 60.0)


def test_the_same_name_in_two_tenants_is_two_schedules(app: cairn.App) -> None:
    a = app.schedule("* * * * *", "report", tenant="acme", kwargs={"topic": "a"})
    b = app.schedule("* * * * *", "report", tenant="globex", kwargs={"topic": "b"})
    assert a.run_id(60.0) != b.run_id(60.0)
    assert a.inputs(60.0) == {"topic": "a"}


BAD: list[tuple[dict[str, Any], str]] = [
    ({"cron": "* * * * * * *"}, "it has 7 fields"),
    ({"cron": "*/0 * * * *"}, "invalid cron expression '*/0 * * * *'"),
    ({"timezone": "Nowhere/Land"}, "unknown time zone 'Nowhere/Land'"),
    ({"timezone": ""}, "unknown time zone ''"),
    ({"workflow": "nope"}, "unknown workflow 'nope'"),
    ({"tenant": ""}, "the tenant must be a non-empty string"),
    ({"name": ""}, "the name must be a non-empty string"),
    ({"queue": ""}, "the queue must be a non-empty string"),
    ({"grace": -1}, "grace must be a number of seconds >= 0, not -1"),
    ({"grace": math.nan}, "grace must be a number of seconds >= 0"),
    ({"missed": "twice"}, "missed must be one of 'skip', 'once', 'all', not 'twice'"),
    ({"priority": "high"}, "priority must be an integer"),
    ({"kwargs": {}}, "arguments do not fit workflow 'report'"),
    ({"kwargs": {"topic": 1}}, "arguments do not fit workflow 'report'"),
    ({"kwargs": {"topic": "x", "extra": 1}}, "arguments do not fit workflow 'report'"),
    ({"kwargs": {"topic": math.inf}}, "kwargs cannot be stored"),
    ({"tick_arg": "when"}, "workflow 'report' has no parameter 'when' for tick_arg"),
    ({"kwargs": {"topic": "x", "at": None}, "tick_arg": "at"}, "'at' is the tick argument"),
    # a tick's run id is schedule:<tenant>:<name>:<time>, percent-encoded: it must pass the id rule
    ({"name": "n" * 170}, "its ticks' run ids"),
    ({"name": "é" * 30}, "characters long; at most 200"),
    ({"tenant": "t" * 171}, "use a shorter name"),
]


@pytest.mark.parametrize(("options", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_at_declaration(app: cairn.App, options: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"cron": "* * * * *", "workflow": "report", "kwargs": {"topic": "x"},
                                 **options}
    with pytest.raises(cairn.InvalidSchedule) as info:
        app.schedule(arguments.pop("cron"), arguments.pop("workflow"), **arguments)
    text = str(info.value)
    assert message in text, text
    assert text.startswith("schedule '")
    assert "\n" not in text
    assert app.runtime.schedules == {}


def test_a_name_is_declared_once_per_tenant(app: cairn.App) -> None:
    app.schedule("* * * * *", "report", kwargs={"topic": "x"})
    with pytest.raises(cairn.InvalidSchedule, match="already declared"):
        app.schedule("*/5 * * * *", "report", kwargs={"topic": "y"})
    assert app.runtime.schedules[("default", "report")].timetable.cron == "* * * * *"


def test_the_decorator_needs_a_workflow(app: cairn.App) -> None:
    with pytest.raises(cairn.InvalidSchedule, match="decorates a workflow"):
        @app.schedule("* * * * *")
        def plain(ctx: cairn.Context) -> None: ...


def test_a_name_whose_tick_ids_fit_is_accepted(app: cairn.App) -> None:
    declared = app.schedule("* * * * *", "report", name="n" * 150, kwargs={"topic": "x"})
    assert declared.name == "n" * 150
