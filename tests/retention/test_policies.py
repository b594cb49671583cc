"""Retention policies: the rules as pure functions, and ``cairn retention``
end to end on both backends: the actor of every change stored with it, a
bad policy a one-line error with nothing stored, an audit policy shorter
than the history it covers refused, the dry run's JSON."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from cairn.cli.main import main as cli
from cairn.errors import InvalidArgument
from cairn.store import retention as rt
from cairn.store.retention import ANY, DataClass
from tests.retention.world import DAY, build


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * DAY), ("12h", 43200.0), ("1y", 365 * DAY),
                                               ("90", 90.0), ("0", 0.0), ("1.5h", 5400.0),
                                               ("FOREVER", None)])
def test_periods(text: str, seconds: float | None) -> None:
    assert rt.parse_keep(text) == seconds


@pytest.mark.parametrize(("text", "problem"), [("-5d", "negative"), ("-1", "negative"), ("soon", "not a"),
                                               ("nan", "not a"), ("inf", "not a"), ("", "not a"),
                                               ("30 days", "not a"), ("1e400", "not a")])
def test_bad_periods(text: str, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        rt.parse_keep(text)


def test_bad_policies() -> None:
    for args, problem in (((None, None, "bodies", "1d"), "unknown data class 'bodies'"),
                          ((None, "wf", "thread-memory", "1d"), "takes a tenant only"),
                          (("", None, "history", "1d"), "tenant must be"),
                          (("a\nb", None, "history", "1d"), "tenant must be"),
                          ((None, None, "history", -1.0), "negative"),
                          ((None, None, "history", math.nan), "not a retention period"),
                          ((None, None, "history", True), "not a retention period")):
        with pytest.raises(InvalidArgument, match=problem):
            rt.policy(*args)  # type: ignore[arg-type]


def test_the_most_specific_policy_decides() -> None:
    made = [rt.policy(None, None, "history", "30d"), rt.policy("a", None, "history", "60d"),
            rt.policy(None, "wf", "history", "90d"), rt.policy("a", "wf", "history", "forever")]
    keep = {scope: rt.effective(made, DataClass.HISTORY, *scope) for scope in
            (("b", "x"), ("a", "x"), ("b", "wf"), ("a", "wf"), (ANY, ANY))}
    assert {scope: p.keep if p else "none" for scope, p in keep.items()} == {
        ("b", "x"): 30 * DAY, ("a", "x"): 60 * DAY, ("b", "wf"): 90 * DAY, ("a", "wf"): None,
        (ANY, ANY): 30 * DAY}
    assert rt.effective(made, DataClass.AUDIT, "a", "wf") is None
    cut = rt.cutoffs(made, DataClass.HISTORY, 1000 * DAY)
    assert cut.due("b", "x", 969 * DAY)
    assert not cut.due("b", "x", 970 * DAY)
    assert not cut.due("a", "wf", 0.0)  # forever
    assert cut.latest == 970 * DAY


def test_audit_records_must_outlive_the_history_they_cover() -> None:
    history = rt.policy(None, None, "history", "1y")
    rt.check([history, rt.policy(None, None, "audit", "7y")])
    rt.check([history, rt.policy(None, None, "audit", "1y")])  # as long is enough
    audit = rt.policy(None, None, "audit", "7y")
    for refused, where in (([history, rt.policy(None, None, "audit", "30d")], "every tenant"),
                           ([audit], "no history policy"),
                           ([history, audit, rt.policy("a", "wf", "history", "8y")], "tenant a, workflow wf"),
                           ([history, audit, rt.policy("a", None, "audit", "1d")], "tenant a")):
        with pytest.raises(InvalidArgument, match=where):
            rt.check(refused)


def test_the_cli_sets_lists_and_removes_policies_with_their_actor(place: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    world = build(place)
    monkeypatch.setenv("CAIRN_ACTOR", "ada")
    code, out = run("retention", "set", "history", "30d", "--db", place)
    assert (code, out) == (0, "set: history of tenant * workflow *: keep 30d (by user:ada)\n")
    assert run("retention", "set", "model-bodies", "7d", "--tenant", "acme", "--workflow", "chat",
               "--db", place)[0] == 0
    code, out = run("retention", "ls", "--json", "--db", place)
    assert code == 0, out
    listed = [json.loads(line) for line in out.splitlines()]
    assert [(p["tenant"], p["workflow"], p["class"], p["keep"], p["updated_by"]) for p in listed] == [
        ("*", "*", "history", "30d", "user:ada"), ("acme", "chat", "model-bodies", "7d", "user:ada")]
    monkeypatch.setenv("CAIRN_ACTOR", "bob")
    assert run("retention", "set", "history", "60d", "--db", place)[0] == 0
    (changed,) = [p for p in world.store.retention_policies() if p.data_class is DataClass.HISTORY]
    assert (changed.keep, changed.updated_by) == (60 * DAY, "user:bob")
    assert run("retention", "rm", "model-bodies", "--tenant", "acme", "--workflow", "chat",
               "--db", place) == (0, "removed: the model-bodies policy of tenant acme workflow chat\n")
    code, out = run("retention", "rm", "model-bodies", "--tenant", "acme", "--db", place)
    assert code == 1
    assert out == "error: no model-bodies policy for tenant acme workflow *\n"
    code, out = run("retention", "plan", "--json", "--db", place)
    assert code == 0
    assert json.loads(out)["classes"]["history"] == {"count": 0, "units": []}
    assert run("retention", "run", "--db", place)[0] == 0


@pytest.mark.parametrize(("args", "problem"), [
    (("bodies", "30d"), "unknown data class 'bodies'"),
    (("--", "history", "-5d"), "a retention period cannot be negative: '-5d'"),
    (("history", "soon"), "not a retention period: 'soon'"),
    (("history", "NaN"), "not a retention period: 'NaN'"),
    (("kv-memory", "1d", "--workflow", "chat"), "kv-memory belongs to a tenant's threads and namespaces"),
    (("audit", "1d"), "audit records of every tenant would be kept 1d, less than the run history they cover "
                      "(forever (no history policy))"),
])
def test_a_bad_policy_is_one_line_and_stores_nothing(place: str, args: tuple[str, ...], problem: str) -> None:
    world = build(place)
    code, out = run("retention", "set", "--db", place, *args)
    assert code == 1, out
    assert out.startswith(f"error: {problem}"), out
    assert out.count("\n") == 1
    assert "Traceback" not in out
    assert world.store.retention_policies() == []
    assert world.raw("SELECT count(*) FROM retention_policies") == [(0,)]


def test_removing_the_history_policy_an_audit_policy_needs_is_refused(place: str) -> None:
    world = build(place)
    ret = world.app.operator.retention
    ret.set("history", "30d")
    ret.set("audit", "1y")
    with pytest.raises(InvalidArgument, match="no history policy"):
        ret.remove("history")
    with pytest.raises(InvalidArgument, match="less than the run history"):
        ret.set("history", "2y")
    assert [(p.data_class, p.keep) for p in world.store.retention_policies()] == [
        (DataClass.AUDIT, 365 * DAY), (DataClass.HISTORY, 30 * DAY)]


def test_a_tree_goes_whole_only_when_every_member_is_due_under_its_own_policy() -> None:
    from cairn.store import lifecycle as lc

    made = [rt.policy(None, None, "history", "30d"), rt.policy("b", None, "history", "forever"),
            rt.policy("a", "slow", "history", "1y")]
    cut = rt.cutoffs(made, DataClass.HISTORY, 1000 * DAY)
    old = 900 * DAY  # 100 days ago
    trees = {
        "a": [("a", "completed", old, "a", "wf")],
        # b's runs are kept forever: its child keeps the tree
        "mixed": [("mixed", "completed", old, "a", "wf"), ("child", "completed", old, "b", "wf")],
        "slow": [("slow", "completed", old, "a", "wf"), ("kid", "failed", old, "a", "slow")],  # a/slow: 1y
        "recent": [("recent", "completed", 990 * DAY, "c", "wf")],  # 10 days old
        "c": [("c", "cancelled", old, "c", "wf"), ("c1", "completed", old, "c", "other")],
    }
    chosen: list[str] = []
    lc.choose_trees(list(trees), trees, lc.prune_statuses(None), cut, 100, chosen)
    assert chosen == ["a", "c", "c1"]
    assert lc.prune_cutoff(cut) == 970 * DAY
    assert lc.prune_cutoff(rt.cutoffs([], DataClass.HISTORY, 0.0)) is None
