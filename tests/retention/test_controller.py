"""The retention controller on both backends (issue 26 part 3): the plan is
exactly what a pass deletes; the most specific policy decides and nothing it
keeps goes; one pass leaves nothing due; no reference is left dangling; an
expired model body is a clear error on replay and the audit chain still
verifies (against an anchor too); a stale controller deletes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

import cairn
from cairn.api.audit import Audit, Verdict
from cairn.api.auditanchor import generate_key
from cairn.errors import PayloadError, RetentionFenced
from cairn.models import Message
from cairn.store import retention as rt
from cairn.store.records import RunStatus
from cairn.store.retention import DataClass
from cairn.worker.retention import Controller, RetentionLoop
from tests.encryption.test_sealed_store import keyring
from tests.retention.world import DAY, World, build, dangling, expired_sql, verified


def aged(place: str, *, sealed: bool = False) -> World:
    """Runs of tenants a and b, workflows chat and other, 40 days old, and
    one of each tenant a day old."""
    world = build(place, keyring=keyring() if sealed else None)
    for name, tenant, workflow in (("a-chat", "a", "chat"), ("a-chat2", "a", "chat"),
                                   ("a-other", "a", "other"), ("b-chat", "b", "chat")):
        world.make(name, tenant, workflow)
    world.clock.advance(39 * DAY)
    world.make("a-new", "a")
    world.make("b-new", "b")
    world.index()
    world.clock.advance(DAY)
    return world


def policies(world: World) -> None:
    ret = world.app.operator.retention
    ret.set("history", "30d")                              # every tenant, every workflow
    ret.set("history", "365d", tenant="a", workflow="other")  # but a's "other" runs: a year
    ret.set("history", "forever", tenant="b")              # and b's: forever
    ret.set("audit", "forever", tenant="b")  # first: b's history is kept forever, its audit records too
    ret.set("audit", "400d")
    ret.set("model-bodies", "10d")
    ret.set("artifacts", "20d", tenant="b")
    ret.set("thread-memory", "30d")
    ret.set("kv-memory", "30d", tenant="a")                # b's kv items: no policy, kept
    ret.set("semantic-memory", "30d")


def body_of(world: World, run_id: str, kind: str = "model") -> bytes:
    for event in world.app.operator.history(run_id):
        if event.step_kind == kind and event.payload is not None:
            return world.app.runtime.payloads.raw(event.payload, what=f"the {kind} call of {run_id}")
    raise AssertionError(f"no {kind} entry in {run_id}")


def test_the_plan_is_what_a_pass_deletes_and_the_most_specific_policy_decides(place: str) -> None:
    world = aged(place)
    policies(world)
    ret = world.app.operator.retention
    runs = world.runs
    plan = ret.plan()
    assert {key[0] for key in plan.units[DataClass.HISTORY]} == {runs["a-chat"], runs["a-chat2"]}
    assert {key[0] for key in plan.units[DataClass.MODEL_BODIES]} == \
        {runs["a-chat"], runs["a-chat2"], runs["a-other"], runs["b-chat"]}
    assert {key[0] for key in plan.units[DataClass.ARTIFACTS]} == {runs["b-chat"]}
    assert {key[0] for key in plan.units[DataClass.KV_MEMORY]} == {"a"}
    assert {key[2] for key in plan.units[DataClass.SEMANTIC_MEMORY]} == {"sem-a-chat", "sem-a-chat2",
                                                                          "sem-a-other", "sem-b-chat"}
    assert len(plan.units[DataClass.THREAD_MEMORY]) == 4
    assert world.raw("SELECT count(*) FROM retention_deleted") == [(0,)]  # a plan changes nothing

    refs = "SELECT payload_ref FROM history WHERE run_id = :r AND payload_ref IS NOT NULL AND step_kind = :k"
    (expiring,) = [r for (r,) in world.raw(refs, r=runs["b-chat"], k="step")]
    assert world.store.get_artifact(expiring)
    done = ret.run()
    assert done.fenced is None
    with pytest.raises(PayloadError, match="missing"):
        world.store.get_artifact(expiring)  # its artifact collected: the row keeps only the ref
    for cls in DataClass:
        assert sorted(done.units[cls]) == sorted(plan.units[cls]), cls  # plan == what went

    # nothing a policy keeps went
    for kept in ("a-other", "b-chat", "a-new", "b-new"):
        assert world.store.get_run(runs[kept]) is not None
    for gone in ("a-chat", "a-chat2"):
        assert world.store.get_run(runs[gone]) is None
        assert world.app.operator.history(runs[gone]) == []
    assert body_of(world, runs["a-new"]).startswith(b"{")  # a day old: kept
    assert len(body_of(world, runs["a-other"], "step")) > 2000  # a's artifacts: no policy, kept
    with pytest.raises(PayloadError, match="expired under the artifacts retention policy"):
        body_of(world, runs["b-chat"], "step")
    assert world.app.operator.memory_item("b", ("docs",), "kv-b-chat") is not None  # b's kv: no policy
    assert world.app.operator.memory_item("a", ("docs",), "kv-a-other") is None
    assert world.app.operator.memory_item("a", ("docs",), "kv-a-new") is not None
    assert world.app.operator.memory_item("a", ("search",), "sem-a-new") is not None
    assert world.app.operator.thread_messages("a", "th-a-new") != []
    assert world.app.operator.thread_messages("a", "th-a-other") == []

    # expired model bodies: a clear error on read, the entries and their digests stay
    with pytest.raises(PayloadError, match="expired under the model-bodies retention policy"):
        body_of(world, runs["a-other"])
    expired = f"SELECT count(*) FROM history WHERE {expired_sql(place)}"
    assert world.raw(expired)[0][0] == 3  # 2 model bodies (of the runs kept) and 1 by-reference step result
    # the records of the deleted runs, with the actor
    records = {d.run_id: d for d in world.store.deleted_runs()}
    assert set(records) == {runs["a-chat"], runs["a-chat2"]}
    assert {d.deleted_by for d in records.values()} == {"system:retention"}
    assert all(d.last_seq > 5 and d.head is not None and len(d.head) in (32, 33) for d in records.values())

    assert dangling(world) == {}
    chains = verified(world)
    assert chains.expired == 3

    # one pass leaves nothing due; another period later, what aged past its policy goes
    assert all(not keys for keys in ret.plan().units.values())
    world.clock.advance(10 * DAY)
    assert {key[0] for key in ret.plan().units[DataClass.MODEL_BODIES]} == {runs["a-new"], runs["b-new"]}
    ret.run()
    assert all(not keys for keys in ret.plan().units.values())
    assert dangling(world) == {}
    assert verified(world).expired == 5


def test_a_sealed_store_expires_ciphertext_and_still_verifies(place: str) -> None:
    world = aged(place, sealed=True)
    world.app.operator.retention.set("model-bodies", "10d")  # no history policy: runs stay
    refs = "SELECT payload_ref FROM history WHERE run_id = :r AND step_kind = 'model'"
    (ref,) = [r for (r,) in world.raw(refs, r=world.runs["a-chat"])]
    world.app.operator.retention.run()
    with pytest.raises(PayloadError, match="expired"):
        body_of(world, world.runs["a-chat"])
    with pytest.raises(PayloadError, match="missing"):
        world.store.get_artifact(ref)  # the body was an artifact: collected
    assert body_of(world, world.runs["a-new"]).startswith(b"{")
    assert verified(world).expired == 4
    assert dangling(world) == {}


def test_replaying_an_expired_model_body_is_a_clear_error(place: str, tmp_path: Path) -> None:
    world = build(place)
    flag = tmp_path / "fail"
    flag.write_text("1")
    model = cairn.models.ScriptedModel(lambda request, n: Message(role="assistant", content="ok"))

    @world.app.step()
    def check() -> bool:
        return flag.exists()

    @world.app.workflow(name="flaky")
    def flaky(ctx: cairn.Context, text: str) -> str:
        reply = ctx.model(model, [Message(role="user", content=text)])
        if check():
            raise ValueError("failed once")
        return reply.message.content or ""

    with pytest.raises(Exception, match="failed once"):
        world.app.run("flaky", "hi", run_id="flaky-1")
    assert world.store.get_run("flaky-1").status is RunStatus.FAILED
    world.clock.advance(20 * DAY)
    world.app.operator.retention.set("model-bodies", "10d")
    assert world.app.operator.retention.run().count(DataClass.MODEL_BODIES) == 1
    flag.unlink()
    world.app.operator.retry("flaky-1")
    with pytest.raises(cairn.RunFailed, match="model 'scripted-1' at position 0 of run 'flaky-1': its body "
                                              "expired under the model-bodies retention policy"):
        world.app.resume("flaky-1")
    assert world.store.get_run("flaky-1").status is RunStatus.FAILED


def test_a_stale_controller_deletes_nothing(place: str) -> None:
    world = aged(place)
    policies(world)
    store = world.store
    stale = Controller(store, "stale", lease_seconds=60)
    assert stale._renew()
    assert stale.epoch == 1
    fence = ("stale", 1)
    now = store.clock()
    bodies = rt.cutoffs(store.retention_policies(), DataClass.MODEL_BODIES, now)
    history = rt.cutoffs(store.retention_policies(), DataClass.HISTORY, now)
    due = store.retention_due(bodies)

    # while the stale one holds the lease, another controller takes nothing
    assert Controller(store, "fresh").run() is None
    world.clock.advance(61)  # the stale holder paused past its lease ...
    with pytest.raises(RetentionFenced):
        store.retention_delete(bodies, due, fence)  # ... an expired lease fences it even before a takeover
    fresh = Controller(store, "fresh", lease_seconds=60)
    assert fresh._renew()
    assert fresh.epoch == 2
    before = world.raw("SELECT run_id, seq, payload FROM history ORDER BY run_id, seq")
    for attempt in (lambda: store.retention_delete(bodies, due, fence),
                    lambda: store.prune_runs(history, fence=fence, actor="stale")):
        with pytest.raises(RetentionFenced, match="lost its lease"):
            attempt()
    assert world.raw("SELECT run_id, seq, payload FROM history ORDER BY run_id, seq") == before
    assert store.deleted_runs() == []
    assert stale.run() is None  # its next pass finds the lease taken
    done = fresh.run()
    assert done is not None
    assert done.count(DataClass.HISTORY) == 2


def test_the_worker_side_loop_enforces_within_one_period(place: str) -> None:
    world = aged(place)
    policies(world)
    loop = RetentionLoop(world.store, "worker-1", interval=60.0)
    other = RetentionLoop(world.store, "worker-2", interval=60.0)
    assert loop.cycle_guarded() == 60.0
    assert all(not keys for keys in world.app.operator.retention.plan().units.values())
    world.clock.advance(10 * DAY)
    assert world.app.operator.retention.plan().count(DataClass.MODEL_BODIES) == 2
    assert loop.cycle_guarded() == 60.0  # the next period: what aged past its policy goes
    assert all(not keys for keys in world.app.operator.retention.plan().units.values())
    assert other.controller.run() is None  # worker-1 holds the lease: worker-2 deletes nothing
    world.clock.advance(121)  # worker-1 died: its lease expires, worker-2's next period takes over
    taken = other.controller.run()
    assert taken is not None
    assert taken.fenced is None
    assert other.controller.epoch == 2


def test_audit_verify_against_an_anchor_after_retention(place: str, tmp_path: Path) -> None:
    world = aged(place)
    key, anchor = tmp_path / "audit.key", tmp_path / "anchor.jsonl"
    generate_key(key)
    audit = Audit(world.store)
    audit.checkpoint(key, anchor=anchor)
    policies(world)
    world.app.operator.retention.run()
    report = audit.verify(anchor=anchor, key=Path(f"{key}.pub"))
    assert report.verdict is not Verdict.TAMPERED, report.summary()
    assert (report.deleted, report.expired) == (2, 3), report.summary()
    assert "DELETED" in report.summary()
    assert "EXPIRED" in report.summary()

    # a record does not excuse a run deleted by hand without one, nor a body blanked by hand
    victim = world.runs["a-new"]
    world.raw("DELETE FROM history WHERE run_id = :r", r=victim)
    world.raw("DELETE FROM runs WHERE run_id = :r", r=victim)
    report = audit.verify(anchor=anchor, key=Path(f"{key}.pub"))
    assert report.verdict is Verdict.TAMPERED
    assert any(p.run_id == victim and "gone" in p.what for p in report.problems), report.problems


def test_an_expired_marker_where_no_class_puts_one_is_tampering(place: str) -> None:
    world = aged(place)
    run_id = world.runs["a-new"]
    marker = rt.expired_marker(DataClass.MODEL_BODIES, world.clock())
    seq = world.raw("SELECT seq FROM history WHERE run_id = :r AND event = 'run.created'", r=run_id)[0][0]
    world.raw("UPDATE history SET payload = :m WHERE run_id = :r AND seq = :s", m=marker, r=run_id, s=seq)
    problems = Audit(world.store).verify().problems
    assert [(p.run_id, p.seq) for p in problems] == [(run_id, seq)]
    assert "removed by hand" in problems[0].what


def test_prune_is_the_same_path_and_records_its_actor(place: str) -> None:
    world = build(place)
    world.clock.advance(-60)  # the operator's cutoff is the wall clock's: the runs ended a minute ago
    for name in ("one", "two"):
        world.make(name, "a")
    operator = world.app.operator.acting_as("cli:ada@host")
    assert world.raw("SELECT count(*) FROM memory_run") == [(2,)]
    assert operator.prune(0) == 2
    records = world.store.deleted_runs()
    assert {d.run_id: d.deleted_by for d in records} == {world.runs["one"]: "cli:ada@host",
                                                          world.runs["two"]: "cli:ada@host"}
    assert world.raw("SELECT count(*) FROM memory_run") == [(0,)]
    assert dangling(world) == {}
    verified(world)


def test_archived_runs_go_once_their_archive_is_older_than_its_policy(place: str) -> None:
    """Class ``archives``: an archived run (with its tree and archive object,
    through prune_runs) goes once archived longer than its tenant's policy;
    a run archived later, or of a tenant without the policy, stays. The plan
    names exactly what the pass deletes."""
    world = build(place)
    for name, tenant in (("old", "a"), ("young", "a"), ("other", "b")):
        world.make(name, tenant)
    operator = world.app.operator
    operator.archive_run(world.runs["old"])
    operator.archive_run(world.runs["other"])
    world.clock.advance(40 * DAY)
    operator.archive_run(world.runs["young"])  # archived today
    operator.retention.set("archives", "30d", tenant="a")
    plan = Controller(world.store, "planner").plan()
    assert [key[0] for key in plan.units[DataClass.ARCHIVES]] == [world.runs["old"]]
    done = Controller(world.store, "controller").run()
    assert done is not None
    assert done.units[DataClass.ARCHIVES] == plan.units[DataClass.ARCHIVES]
    assert world.store.get_run(world.runs["old"]) is None
    assert world.store.run_archive(world.runs["young"]) is not None
    assert world.store.run_archive(world.runs["other"]) is not None
    assert dangling(world) == {}
    assert Controller(world.store, "planner").plan().units[DataClass.ARCHIVES] == []
