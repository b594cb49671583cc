"""Erasure by subject, thread or tenant (issue 26): what ``cairn erase``,
``Operator.erase`` and ``POST /v1/erasures`` do.

One erasure, in an order chosen so that an interruption at any point leaves
the strongest guarantee reached so far and running it again completes it:

1. **Record** it as started (``erasures``: a digest of the target, keyed under
   encryption, the scope, the actor, the time; no personal data). An
   unfinished record of the same target is taken up again instead.
2. **Kill** the target's unfinished runs (the kill switch: their holders are
   fenced), so none writes again and all can be deleted.
3. **Crypto-shred** (subject and tenant scopes, encryption on): the subject
   keys are destroyed (``SealedStore.shred``): from here on nothing the
   subject's runs or memory stored can be read, from this database or any
   copy of it, even before the rows are gone.
4. **Delete** the subject's memory (items with their vectors, outbox rows and
   cold copies; thread messages), then its runs through ``prune_runs`` (the
   one run-deletion path, whole trees, with their histories, mailboxes,
   approvals and run memory), collecting their artifacts at once (no grace).
5. **Reclaim** the freed space (``Store.reclaim_space``: SQLite
   ``secure_delete`` + ``VACUUM`` + a ``TRUNCATE`` checkpoint; PostgreSQL
   ``VACUUM``), then record the erasure as finished with its counts.

What each scope covers: ``subject``: the tenant's runs started for the
subject (their children inherit it) and the memory written for it;
``thread``: the tenant's runs of the thread, the memory they wrote (items,
run memory, messages) and the thread's messages;
``tenant``: every run and all memory of the tenant, and its subject keys.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cairn.errors import InvalidArgument
from cairn.faults import fault_point
from cairn.store.contract import Store
from cairn.store.erasuresql import ErasureRecord
from cairn.store.lifecycle import TERMINAL
from cairn.store.memrecords import MemoryScope
from cairn.store.records import RunStatus, check_names, check_subject

#: runs deleted per transaction
ERASE_BATCH = 500
#: the reason recorded on the runs an erasure kills
KILL_REASON = "erased"


@dataclass(frozen=True, slots=True)
class Target:
    """What an erasure covers, within one tenant."""

    tenant: str
    subject: str | None = None
    thread: str | None = None

    @property
    def scope(self) -> str:
        return "subject" if self.subject is not None else "thread" if self.thread is not None else "tenant"

    def check(self) -> None:
        """``InvalidArgument`` (one line) for a target that is not one subject,
        one thread or one tenant."""
        check_names(tenant=self.tenant)
        if self.subject is not None and self.thread is not None:
            raise InvalidArgument("erase a subject or a thread, not both")
        check_subject(self.subject)
        if self.thread is not None:
            check_names(thread_id=self.thread)

    def digest(self, store: Store) -> str:
        """The digest the record keeps (keyed under encryption): the target
        itself is never stored."""
        if self.subject is not None:
            return store.subject_digest(self.tenant, self.subject)
        if self.thread is not None:
            return store.subject_digest(self.tenant, "\x00thread\x00" + self.thread)
        return store.subject_digest(self.tenant, "\x00tenant")


@dataclass(frozen=True, slots=True)
class Erasure:
    """What an erasure did (``dry_run``: would do): its record (``None`` in
    a dry run) and its counts: runs deleted, unfinished runs killed first,
    memory rows deleted, subject keys destroyed; ``reclaimed``: what the
    space reclamation did; ``resumed``: an interrupted erasure taken up."""

    target: Target
    dry_run: bool
    counts: dict[str, int]
    record: ErasureRecord | None = None
    reclaimed: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.target.scope, "tenant": self.target.tenant, "dry_run": self.dry_run,
                "counts": self.counts, "resumed": self.resumed, "reclaimed": self.reclaimed,
                "record": None if self.record is None else self.record.as_dict()}


def run_digest(store: Store, tenant: str, run_id: str) -> str:
    """What an erasure record keeps of a run it deleted (keyed under
    encryption): enough for ``cairn audit verify`` to tell an anchored run
    that was erased from one cut out of the history, and nothing more."""
    return store.subject_digest(tenant, "\x00run\x00" + run_id)


def _subject_keys(store: Store, target: Target, digest: str) -> int:
    """How many live subject keys the target's shredding would destroy."""
    rows = getattr(store, "data_keys", None)
    if rows is None or not getattr(store, "sealed", False) or target.scope == "thread":
        return 0
    key_digest = None if target.subject is None else digest
    return sum(1 for row in rows(target.tenant)
               if row.subject is not None and not row.erased
               and (key_digest is None or row.subject == key_digest))


def erase(store: Store, target: Target, *, actor: str, dry_run: bool = False,
          kill: Callable[[str], object] | None = None) -> Erasure:
    """Erase ``target`` from ``store`` (see the module doc); ``kill(run_id)``
    kills an unfinished run (default: the store's kill switch, as ``actor``)."""
    target.check()
    digest = target.digest(store)
    runs = store.erasure_runs(target.tenant, target.subject, target.thread)
    unfinished_runs = {run_id for run_id, status, _ in runs if status not in TERMINAL}
    # the kill switch takes a run with its descendants: kill the topmost unfinished ones
    live = sorted(run_id for run_id, _, parent in runs if run_id in unfinished_runs
                  and parent not in unfinished_runs)
    if dry_run:
        memory = (store.count_subject_memory(target.tenant, target.subject) if target.subject is not None
                  else -1)
        counts = {"runs": len(runs), "killed": len(unfinished_runs),
                  "keys": _subject_keys(store, target, digest)}
        if memory >= 0:
            counts["memory"] = memory
        return Erasure(target, True, counts)
    unfinished = store.erasures(target.tenant, unfinished=(target.scope, digest), limit=1)
    if unfinished:
        record = unfinished[0]
    else:
        record = ErasureRecord(uuid.uuid4().hex, target.tenant, target.scope, digest, actor, time.time(),
                               None, {})
        store.start_erasure(record)
    deleting = {run_digest(store, target.tenant, run_id) for run_id, _, _ in runs}
    store.note_erased_runs(record.id, record.runs | deleting)  # before any run goes
    for run_id in live:  # nothing of the target writes again; every run of it can be deleted
        if kill is not None:
            kill(run_id)
        else:
            store.kill_runs(KILL_REASON, run_id=run_id, actor=actor)
    keys = 0
    if target.scope != "thread":
        keys = len(store.shred(target.tenant, None if target.subject is None else digest))
    fault_point("erase.after_shred")
    if target.subject is not None:
        memory = store.delete_subject_memory(target.tenant, target.subject)
    elif target.thread is not None:  # the thread's messages, and what its runs wrote anywhere
        memory = store.delete_memory(MemoryScope(target.tenant, thread_id=target.thread))
        memory += sum(store.delete_memory(MemoryScope(target.tenant, run_id=run_id)) for run_id, _, _ in runs)
    else:
        memory = store.delete_memory(MemoryScope(target.tenant))
    ids = [run_id for run_id, _, _ in store.erasure_runs(target.tenant, target.subject, target.thread)]
    deleted = 0
    statuses = [RunStatus(status) for status in TERMINAL]
    while ids:
        cutoff = store.clock() + 0.001  # every run killed above is older
        pruned = store.prune_runs(cutoff, statuses, ERASE_BATCH, roots=ids, grace=False, record=False)
        deleted += pruned
        left = [run_id for run_id, _, _ in store.erasure_runs(target.tenant, target.subject, target.thread)]
        if not pruned or not left:
            if left:  # a run started for the target meanwhile (or a tree rooted elsewhere): say so
                raise InvalidArgument(f"{len(left)} run(s) of the {target.scope} could not be deleted "
                                      "(started during the erasure, or in a tree rooted elsewhere): "
                                      "erase again")
            break
        ids = left
    reclaimed = store.reclaim_space()
    counts = {"runs": deleted, "killed": len(unfinished_runs), "memory": memory, "keys": keys}
    store.finish_erasure(record.id, counts, actor, tenant=record.tenant)
    done = next((r for r in store.erasures(target.tenant, limit=100) if r.id == record.id), record)
    return Erasure(target, False, counts, done, reclaimed, resumed=bool(unfinished))
