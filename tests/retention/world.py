"""A store with data of every retention class, aged by a fake store clock,
and the checks every retention test makes of it: nothing dangling, the
audit chain still verifying."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import cairn
from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer
from cairn.models import Message, ModelRequest, ScriptedModel
from cairn.store.auditverify import verify_store
from tests.encryption.test_sealed_store import Raw
from tests.store.contract.helpers import FakeClock

DAY = 86400.0


def answer(request: ModelRequest, n: int) -> Message:
    said = request.messages[-1].content[:20]
    return Message(role="assistant", content=f"answer {n} to {said} " + "x" * 300)


@dataclass
class World:
    """An app whose store's clock is ``clock``, and the runs made in it."""

    place: str
    app: cairn.App
    clock: FakeClock
    runs: dict[str, str] = field(default_factory=dict)  # name -> run id
    tenants: dict[str, str] = field(default_factory=dict)  # name -> tenant

    @property
    def store(self) -> Any:
        return self.app.store

    def make(self, name: str, tenant: str, workflow: str = "chat") -> str:
        """A finished run: a model call, a step result stored as an artifact,
        kv and semantic items, run memory and a thread message, all its own."""
        run_id = f"run-{name}"
        self.app.run(workflow, name, tenant=tenant, run_id=run_id)
        self.runs[name] = run_id
        self.tenants[name] = tenant
        return run_id

    def index(self) -> None:
        """Embed every item waiting for its vector."""
        assert self.app.runtime.memory.embedder is not None
        Indexer(self.store, self.app.runtime.memory.embedder, worker_id="indexer").drain()

    def raw(self, statement: str, **params: Any) -> list[tuple[Any, ...]]:
        return Raw(self.place)(statement, **params)


def build(place: str, *, keyring: Any = None) -> World:
    app = cairn.App(db=place, lease_seconds=5.0, inline_limit=256, embedder=HashEmbedder(16), keyring=keyring)
    clock = FakeClock(time.time())
    app.store.clock = clock
    model = ScriptedModel(answer, model_id="scripted")

    @app.step()
    def big(text: str) -> str:
        return f"{text} " + "z" * 2000  # past inline_limit: an artifact

    def body(ctx: cairn.Context, text: str) -> str:
        reply = ctx.model(model, [Message(role="user", content=f"hello {text}")])
        large = big(text)
        ctx.memory.put(("docs",), f"kv-{text}", f"kv value {text}")
        ctx.memory.put(("search",), f"sem-{text}", f"semantic value {text}", index=f"semantic {text}")
        ctx.memory.run.put("scratch", f"scratch {text}")
        ctx.memory.thread(f"th-{text}").append(f"message of {text}")
        return (reply.message.content or "")[:12] + large[:4]

    app.workflow(name="chat")(body)
    app.workflow(name="other")(body)
    return World(place, app, clock)


def _orphans(table: str, parent: str, *columns: str) -> str:
    """Rows of ``table`` without the row of ``parent`` their ``columns`` name."""
    same = " AND ".join(f"p.{c} = o.{c}" for c in columns)
    return f"SELECT count(*) FROM {table} AS o WHERE NOT EXISTS (SELECT 1 FROM {parent} AS p WHERE {same})"


#: the key columns of a long-term item
ITEM = ("tenant", "namespace", "key")

#: rows that point to a row that is gone, per kind of reference
DANGLING = {
    "history of a deleted run": _orphans("history", "runs", "run_id"),
    "mailbox of a deleted run": _orphans("mailbox", "runs", "run_id"),
    "approvals of a deleted run": _orphans("approvals", "runs", "run_id"),
    "run memory of a deleted run": _orphans("memory_run", "runs", "run_id"),
    "outbox rows of a deleted item": _orphans("memory_outbox", "memory_items", *ITEM),
    "vectors of a deleted item": _orphans("memory_vectors", "memory_items", *ITEM),
    "cold values of a deleted item": _orphans("memory_item_cold", "memory_items", *ITEM),
    "messages of a deleted thread": _orphans("memory_thread_messages", "memory_threads", "tenant",
                                             "thread_id"),
}

#: every artifact a row still needs (not an expired body's: its ref stays for the audit link)
NEEDED_ARTIFACTS = """
SELECT input_ref FROM runs WHERE input_ref IS NOT NULL
UNION SELECT result_ref FROM runs WHERE result_ref IS NOT NULL
UNION SELECT payload_ref FROM history WHERE payload_ref IS NOT NULL AND {live}
UNION SELECT payload_ref FROM mailbox WHERE payload_ref IS NOT NULL
UNION SELECT value_ref FROM memory_run WHERE value_ref IS NOT NULL
UNION SELECT value_ref FROM memory_thread_messages WHERE value_ref IS NOT NULL
UNION SELECT value_ref FROM memory_items WHERE value_ref IS NOT NULL
"""


def expired_sql(place: str) -> str:
    """SQL true for a history row whose body retention expired."""
    if place.startswith("sqlite"):
        return "substr(payload, 1, 2) = X'0003'"
    return "substring(payload FROM 1 FOR 2) = CAST('\\x0003' AS bytea)"


def dangling(world: World) -> dict[str, int]:
    """Every kind of dangling reference with a count above zero (``{}``: none)."""
    found = {what: world.raw(query)[0][0] for what, query in DANGLING.items()}
    live = f"(payload IS NULL OR NOT ({expired_sql(world.place)}))"
    for (ref,) in world.raw(NEEDED_ARTIFACTS.format(live=live)):
        try:
            world.store.get_artifact(ref)
        except cairn.PayloadError:
            found[f"artifact {ref} missing"] = 1
    return {what: n for what, n in found.items() if n}


def verified(world: World) -> Any:
    """The audit chain over the whole store: no problem, whatever retention did."""
    chains = verify_store(world.store)
    assert chains.problems == [], chains.problems
    return chains
