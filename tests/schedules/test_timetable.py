"""Tick computation: cron expressions read in a time zone, across daylight
saving changes, and which ticks a pass fires under each missed-tick policy
(``cairn.engine.schedules``: pure functions, no database)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from cairn.engine.schedules import MAX_TICKS_PER_PASS, Timetable, due, tick_run_id


def utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[arg-type, misc]


def iso(ticks: list[float]) -> list[str]:
    return [datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for t in ticks]


def local(table: Timetable, ticks: list[float]) -> list[str]:
    return [table.local(t).strftime("%m-%d %H:%M%z") for t in ticks]


def test_a_daily_local_time_follows_the_zone_across_summer_and_winter() -> None:
    table = Timetable.parse("0 8 * * *", "Europe/Paris")
    assert iso(table.ticks(utc(2026, 1, 15), utc(2026, 1, 16, 12), 10)) == ["2026-01-15T07:00:00Z",
                                                                            "2026-01-16T07:00:00Z"]
    assert iso(table.ticks(utc(2026, 7, 15), utc(2026, 7, 16, 12), 10)) == ["2026-07-15T06:00:00Z",
                                                                            "2026-07-16T06:00:00Z"]


def test_a_local_time_skipped_in_spring_fires_once_right_after_the_change() -> None:
    # Paris, 2027-03-28: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day
    table = Timetable.parse("30 2 * * *", "Europe/Paris")
    ticks = table.ticks(utc(2027, 3, 27, 12), utc(2027, 3, 30, 12), 10)
    assert local(table, ticks) == ["03-28 03:00+0200", "03-29 02:30+0200", "03-30 02:30+0200"]


def test_a_local_time_repeated_in_autumn_fires_once() -> None:
    # Paris, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice
    table = Timetable.parse("30 2 * * *", "Europe/Paris")
    ticks = table.ticks(utc(2026, 10, 24, 12), utc(2026, 10, 27, 12), 10)
    assert iso(ticks) == ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z", "2026-10-27T01:30:00Z"]


def test_from_inside_the_repeated_hour_the_first_pass_is_not_fired_again() -> None:
    table = Timetable.parse("45 2 * * *", "Europe/Paris")
    # 02:30 CET on 2026-10-25 (the second pass, 01:30Z): 02:45 CEST (00:45Z) is gone already
    after = utc(2026, 10, 25, 1, 30)
    assert iso([table.next_after(after)]) == ["2026-10-26T01:45:00Z"]


def test_an_interval_keeps_its_pace_in_real_time_through_both_changes() -> None:
    table = Timetable.parse("*/30 * * * *", "Europe/Paris")
    autumn = table.ticks(utc(2026, 10, 24, 23), utc(2026, 10, 25, 2, 30), 20)
    assert local(table, autumn) == ["10-25 01:30+0200", "10-25 02:00+0200", "10-25 02:30+0200",
                                    "10-25 02:00+0100", "10-25 02:30+0100", "10-25 03:00+0100",
                                    "10-25 03:30+0100"]
    assert [b - a for a, b in itertools.pairwise(autumn)] == [1800.0] * 6
    spring = table.ticks(utc(2027, 3, 28, 0), utc(2027, 3, 28, 2), 20)
    assert local(table, spring) == ["03-28 01:30+0100", "03-28 03:00+0200", "03-28 03:30+0200",
                                    "03-28 04:00+0200"]
    assert [b - a for a, b in itertools.pairwise(spring)] == [1800.0] * 3


def test_six_fields_put_seconds_first() -> None:
    table = Timetable.parse("*/2 * * * * *", "UTC")
    assert table.ticks(100.5, 108.0, 10) == [102.0, 104.0, 106.0, 108.0]
    assert table.last_at_or_before(107.9) == 106.0
    assert table.last_at_or_before(108.0) == 108.0
    assert table.next_after(108.0) == 110.0


@pytest.mark.parametrize(("cron", "zone", "message"), [
    ("61 * * * *", "UTC", "invalid cron expression '61 * * * *': Bad minute"),
    ("* * *", "UTC", "it has 3 fields"),
    ("", "UTC", "the cron expression is empty"),
    ("0 0 30 2 *", "UTC", "invalid cron expression '0 0 30 2 *'"),
    ("* * * * *", "Europe/Pariss", "unknown time zone 'Europe/Pariss'"),
    ("* * * * *", "../etc/passwd", "unknown time zone '../etc/passwd'"),
])
def test_bad_expressions_and_zones_are_refused_with_one_line(cron: str, zone: str, message: str) -> None:
    from cairn.engine.schedules import InvalidSchedule

    with pytest.raises(InvalidSchedule) as info:
        Timetable.parse(cron, zone, what="schedule 'x'")
    text = str(info.value)
    assert message in text
    assert text.startswith("schedule 'x': ")
    assert "\n" not in text


def test_run_ids_are_stable_and_cannot_collide_across_tenants_and_names() -> None:
    tick = utc(2026, 12, 1, 8, 25)
    assert tick_run_id("acme", "nightly", tick) == "schedule:acme:nightly:2026-12-01T08:25:00Z"
    assert tick_run_id("acme", "nightly", tick) == tick_run_id("acme", "nightly", tick + 0.0)
    assert tick_run_id("a:b", "c", tick) != tick_run_id("a", "b:c", tick)
    assert tick_run_id("a%3Ab", "c", tick) != tick_run_id("a:b", "c", tick)


# -- which ticks a pass fires ---------------------------------------------------------------

EVERY_SECOND = Timetable.parse("* * * * * *", "UTC")


def test_on_time_ticks_fire_one_each_and_nothing_before_the_origin() -> None:
    assert due(EVERY_SECOND, 100.0, 103.5, "skip", 10).fire == (101.0, 102.0, 103.0)
    assert due(EVERY_SECOND, 100.0, 100.0, "once", 10).fire == ()
    assert due(EVERY_SECOND, 100.0, 99.0, "once", 10).fire == ()


def test_skip_passes_over_the_missed_ticks_and_fires_those_within_grace() -> None:
    plan = due(EVERY_SECOND, 100.0, 200.0, "skip", 10)
    assert plan.pass_over == 190.0
    assert plan.missed == 90
    assert plan.fire == tuple(float(t) for t in range(191, 201))


def test_once_fires_one_catch_up_run_for_the_whole_missed_span() -> None:
    plan = due(EVERY_SECOND, 100.0, 200.0, "once", 10)
    assert plan.pass_over is None
    assert plan.missed == 90
    assert plan.fire == (190.0, *(float(t) for t in range(191, 201)))


def test_all_fires_every_missed_tick_a_bounded_number_per_pass() -> None:
    plan = due(EVERY_SECOND, 100.0, 1000.0, "all", 10)
    assert plan.fire == tuple(float(t) for t in range(101, 101 + MAX_TICKS_PER_PASS))
    assert due(EVERY_SECOND, 100.0, 150.0, "all", 10).fire == tuple(float(t) for t in range(101, 151))


def test_a_tick_exactly_grace_old_is_missed_and_one_younger_is_on_time() -> None:
    assert due(EVERY_SECOND, 100.0, 110.0, "skip", 9.0).pass_over == 101.0
    assert due(EVERY_SECOND, 100.0, 110.0, "skip", 9.5).pass_over is None
