"""Unit tests of the admission rules themselves (``cairn.store.admission``);
the contract suite checks every backend applies them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cairn.store.admission import (
    MAX_LANES,
    QUEUE_WIDE,
    Bucket,
    Candidate,
    Lane,
    LaneCursor,
    QueueLimits,
    QueueShare,
    Rate,
    charge,
    charge_shares,
    check_share,
    plan,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100/min", Rate(100, 60.0)),
        ("10/s", Rate(10, 1.0)),
        ("5/30s", Rate(5, 30.0)),
        ("1000/h", Rate(1000, 3600.0)),
        ("3/2.5s", Rate(3, 2.5)),
        (" 7 / day ", Rate(7, 86400.0)),
        ("20/500ms", Rate(20, 0.5)),
        ("4/2", Rate(4, 2.0)),
    ],
)
def test_rate_parse(text: str, expected: Rate) -> None:
    assert Rate.parse(text) == expected


@pytest.mark.parametrize("text", ["", "ten/s", "10", "10/", "10/fortnight", "-1/s", "0/s", "1/0s"])
def test_rate_parse_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        Rate.parse(text)


@pytest.mark.parametrize(
    "make",
    [
        lambda: QueueLimits(""),
        lambda: QueueLimits("q", concurrency=0),
        lambda: QueueLimits("q", tenant_concurrency=-1),
        lambda: Rate(0, 1),
        lambda: Rate(1, 0),
        lambda: Rate(1, float("inf")),
        lambda: Rate(1, float("nan")),
        lambda: Rate(1, 1, burst=0),
    ],
)
def test_bad_limits_are_refused(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match=r"queue|rate"):
        make()


def test_bucket_refills_to_capacity_and_never_backwards() -> None:
    rate = Rate(10, 5, burst=4)  # 2 tokens a second
    assert Bucket(0.0, 100.0).refilled(rate, 101.0) == Bucket(2.0, 101.0)
    assert Bucket(0.0, 100.0).refilled(rate, 200.0) == Bucket(4.0, 200.0)
    assert Bucket(1.0, 100.0).refilled(rate, 90.0) == Bucket(1.0, 100.0)


def _lane(queue: str, tenant: str, running: int, n: int, *, takeovers: int = 0) -> Lane:
    cands = [Candidate(f"{tenant}{i}", queue, tenant, 0, float(i), i < takeovers) for i in range(n)]
    return Lane(queue, tenant, running, cands)


def test_plan_water_fills_by_running_count() -> None:
    lanes = [_lane("q", "a", 2, 5), _lane("q", "b", 0, 5), _lane("q", "c", 1, 5)]
    got = [c.run_id for c in plan(lanes, {}, {}, {}, 0.0, 6)]
    # b rises to c's level, then b and c to a's; ties go to the older head.
    assert got == ["b0", "c0", "b1", "a0", "c1", "b2"]


def test_plan_takeovers_first_and_free() -> None:
    limits = {"q": QueueLimits("q", concurrency=1, rate=Rate(1, 60))}
    lanes = [_lane("q", "a", 1, 3, takeovers=1)]
    got = plan(lanes, limits, {"q": 1}, {("q", QUEUE_WIDE): Bucket(0.0, 0.0)}, 0.0, 5)
    assert [c.run_id for c in got] == ["a0"]
    assert charge(limits, {}, got, 0.0) == {}


def test_plan_full_queue_leaves_others_alone() -> None:
    limits = {"q": QueueLimits("q", concurrency=2)}
    lanes = [_lane("q", "a", 0, 5), _lane("r", "a", 0, 5)]
    got = [c.run_id for c in plan(lanes, limits, {"q": 1}, {}, 0.0, 4)]
    assert sorted(got) == ["a0", "a0", "a1", "a2"]  # one from q, three from r
    assert [c.queue for c in plan(lanes, limits, {"q": 1}, {}, 0.0, 4)].count("q") == 1


def test_charge_spends_queue_and_tenant_tokens() -> None:
    limits = {"q": QueueLimits("q", rate=Rate(10, 1), tenant_rate=Rate(2, 1))}
    claimed = _lane("q", "a", 0, 2).candidates + _lane("q", "b", 0, 1).candidates
    states = charge(limits, {("q", "a"): Bucket(1.5, 9.0)}, claimed, 10.0)
    assert states == {
        ("q", QUEUE_WIDE): Bucket(7.0, 10.0),
        ("q", "a"): Bucket(0.0, 10.0),  # 1.5 + 2 refilled, capped at 2, minus 2
        ("q", "b"): Bucket(1.0, 10.0),
    }


def test_plan_share_rate_holds_its_own_lane_alone() -> None:
    """A tenant's rate share spends its own bucket only: its lane stops at
    the bucket's tokens, the other lane goes on, and the spent state is what
    charge_shares stores (takeovers spend nothing)."""
    mine, theirs = _lane("q", "a", 0, 5, takeovers=1), _lane("q", "b", 0, 5)
    mine.share = QueueShare("q", "a", rate=Rate(2, 60))  # a token per 30 s
    got = plan([mine, theirs], {}, {}, {}, 100.0, 10)
    assert sorted(c.run_id for c in got) == ["a0", "a1", "a2", "b0", "b1", "b2", "b3", "b4"]
    assert charge_shares([mine, theirs], got, 100.0) == {("q", "a"): Bucket(0.0, 100.0)}
    mine.share_bucket = Bucket(0.5, 100.0)
    assert [c.run_id for c in plan([mine], {}, {}, {}, 114.0, 10)] == ["a0"]  # 0.97: the takeover only
    assert [c.run_id for c in plan([mine], {}, {}, {}, 116.0, 10)] == ["a0", "a1"]  # 1.03


def test_check_share_refuses_a_rate_above_the_installations_per_tenant_rate() -> None:
    limits = QueueLimits("q", rate=Rate(1, 60), tenant_rate=Rate(10, 60))
    check_share(QueueShare("q", "a", rate=Rate(10, 60)), limits)
    check_share(QueueShare("q", "a", rate=Rate(1, 6)), limits)  # the same rate in other units
    check_share(QueueShare("q", "a", rate=Rate(50, 3600)), None)  # no limits: any share
    check_share(QueueShare("q", "a", rate=Rate(50, 60)), QueueLimits("q", rate=Rate(1, 60)))
    for rate in (Rate(11, 60), Rate(1, 5), Rate(10, 60, burst=11)):
        with pytest.raises(ValueError, match=r"exceeds the installation's per-tenant rate 10/min"):
            check_share(QueueShare("q", "a", rate=rate), limits)


def test_lane_cursor_moves_on_only_when_the_window_was_full() -> None:
    cursor = LaneCursor()
    cursor.saw("q", ["a", "b"])
    assert cursor.after("q") is None
    full = [f"t{i:03d}" for i in range(MAX_LANES)]
    cursor.saw("q", full)
    assert cursor.after("q") == full[-1]
    assert cursor.positions() == {"q": full[-1]}
    cursor.saw("q", ["x"])
    assert cursor.after("q") is None
