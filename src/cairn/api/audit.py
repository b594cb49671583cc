"""The audit log (issue 26): verify the chains against an anchor, sign and
export checkpoints, and show who did what.

``Audit.verify`` gives one of three verdicts, never a plain pass without an
anchor: ``TAMPERED`` (the first bad entry and what is wrong with it),
``UNANCHORED`` (every chain holds, but entries newer than the last exported
checkpoint, or all of them with no anchor, are verified only as chains: a
cut tail or a rollback there cannot be told) or ``VERIFIED``. Entries whose
keys were destroyed (erasure) are counted as ``ERASED`` in the verdict's
line: their links still hold, their contents can no longer be checked.
``Audit.checkpoint`` signs each tenant's run heads only after verifying
them (against the anchor too, when one exists: a rolled-back database is
never re-anchored in its rolled-back state). ``Audit.log`` lists the
entries with their actor.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from cairn.api import auditanchor
from cairn.api.erasure import run_digest
from cairn.errors import InvalidArgument
from cairn.store import oplog
from cairn.store.auditverify import Chains, Problem, check_anchor, verify_store
from cairn.store.contract import Store


class Verdict(StrEnum):
    VERIFIED = "VERIFIED"
    TAMPERED = "TAMPERED"
    UNANCHORED = "UNANCHORED"


class AuditRefused(InvalidArgument):
    """A checkpoint refused because the history does not verify."""


@dataclass(slots=True)
class Report:
    """What ``Audit.verify`` found."""

    verdict: Verdict
    entries: int = 0
    runs: int = 0
    #: entries covered by an anchored checkpoint
    anchored: int = 0
    #: entries written before the chain existed (not verifiable)
    before_chain: int = 0
    #: entries whose key was destroyed (erasure): their links verified, their contents unreadable
    erased: int = 0
    #: of ``entries``, the operator log's records (``store.oplog``)
    operator_records: int = 0
    #: anchored runs an erasure deleted (its record names them): gone, as recorded
    erased_runs: int = 0
    #: entries whose body a retention policy removed: their links verified, their bodies gone
    expired: int = 0
    #: anchored runs deleted since (by retention or prune), their deletion recorded up to the anchored entry
    deleted: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: tenant -> time of the checkpoint verified against
    anchors: dict[str, float] = field(default_factory=dict)

    @property
    def unanchored(self) -> int:
        return self.entries - self.anchored

    def summary(self) -> str:
        """The verdict and why, in one line."""
        counted = f"{self.entries} entries of {self.runs} runs"
        if self.operator_records:
            counted += f" and operator logs ({self.operator_records} of the entries)"
        if self.before_chain:
            counted += f" ({self.before_chain} written before the audit chain existed, not verifiable)"
        if self.erased:
            counted += (f" ({self.erased} ERASED: their keys were destroyed, their links verified, their "
                        f"contents unreadable)")
        if self.erased_runs:
            counted += f" ({self.erased_runs} anchored run(s) ERASED: deleted by a recorded erasure)"
        if self.expired:
            counted += (f" ({self.expired} EXPIRED: their bodies were removed by a retention policy, their "
                        f"links verified)")
        if self.deleted:
            counted += f" ({self.deleted} anchored runs DELETED since, by retention or prune, as recorded)"
        if self.verdict is Verdict.TAMPERED:
            more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            return f"TAMPERED: {self.problems[0]}{more}"
        if self.verdict is Verdict.VERIFIED:
            return f"VERIFIED: {counted}, all covered by the anchor ({_when(self.anchors)})"
        if not self.anchors:
            return (f"UNANCHORED: {counted} hold together as chains, but no exported checkpoint covers them "
                    f"(run 'cairn audit checkpoint --anchor FILE', then verify with --anchor FILE)")
        return (f"UNANCHORED: {counted} hold together; verified against the anchor ({_when(self.anchors)}) "
                f"up to its checkpoint: {self.unanchored} newer entries are verified only as chains")

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "entries": self.entries, "runs": self.runs,
                "anchored": self.anchored, "unanchored": self.unanchored, "before_chain": self.before_chain,
                "erased": self.erased, "erased_runs": self.erased_runs, "expired": self.expired,
                "deleted": self.deleted, "operator_records": self.operator_records,
                "problems": [{"run_id": p.run_id, "seq": p.seq, "problem": p.what} for p in self.problems],
                "anchors": self.anchors, "summary": self.summary()}


def _when(anchors: dict[str, float]) -> str:
    latest = max(anchors.values())
    return f"checkpoint of {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(latest))} UTC"


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One entry of the log: who did what to which run, when."""

    at: float
    tenant: str
    run_id: str
    seq: int
    event: str
    actor: str
    auth: str
    detail: dict[str, Any] | None
    #: what was acted on: ``run`` (a history entry, ``object_id`` the run) or
    #: an operator log record's object (``token``, ``queue``, ``key``...; ``run_id``
    #: is then its chain's id, ``event`` its action, ``detail`` what changed)
    kind: str = "run"
    object_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "tenant": self.tenant, "run_id": self.run_id, "seq": self.seq,
                "event": self.event, "actor": self.actor, "auth": self.auth, "detail": self.detail,
                "kind": self.kind, "object_id": self.object_id or self.run_id}


class Audit:
    """The audit operations on one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def verify(self, *, tenant: str | None = None, run_id: str | None = None, anchor: Path | None = None,
               key: Path | None = None) -> Report:
        """Verify the chains of ``run_id``, of ``tenant`` or of all, against
        the last checkpoint of each tenant in ``anchor`` (signed with ``key``
        when given: a private key file or its ``.pub``)."""
        return self._verify(tenant, run_id, anchor, key)[0]

    def _verify(self, tenant: str | None, run_id: str | None, anchor: Path | None,
                key: Path | None) -> tuple[Report, Chains]:
        pinned = auditanchor.load_public(key) if key is not None else None
        checkpoints = auditanchor.latest(anchor, pinned) if anchor is not None else {}
        if tenant is not None:
            checkpoints = {t: c for t, c in checkpoints.items() if t == tenant}
        heads: dict[str, tuple[int, bytes]] = {}
        tenant_of: dict[str, str] = {}
        for checkpoint in checkpoints.values():
            for run, head in checkpoint.heads.items():
                if run_id is None or run == run_id:
                    heads[run] = head
                    tenant_of[run] = checkpoint.tenant
        want = {run: seq for run, (seq, _) in heads.items()}
        chains = verify_store(self._store, tenant=tenant, run_id=run_id, want=want)
        records = 0
        if run_id is None and hasattr(self._store, "operator_log"):
            records = oplog.verify_into(chains, self._store, tenant=tenant, want=want)
        erased_runs = self._erased_runs(heads, tenant_of, chains)
        runs = sum(1 for name in chains.heads if not oplog.is_chain(name))
        report = Report(Verdict.UNANCHORED, chains.entries, runs, operator_records=records,
                        before_chain=chains.before_chain, erased=chains.erased, expired=chains.expired,
                        problems=list(chains.problems), erased_runs=erased_runs)
        report.anchors = {t: c.at for t, c in checkpoints.items()}
        stamp = _when(report.anchors) if report.anchors else ""
        deleted = {d.run_id: (d.last_seq, d.head) for d in self._store.deleted_runs(tenant)} if heads else {}
        report.problems += check_anchor(chains, heads, tenant_of, stamp, deleted)
        report.deleted = chains.deleted
        report.anchored = sum(seq for run, (seq, _) in heads.items() if chains.found.get(run) is not None)
        if report.problems:
            report.verdict = Verdict.TAMPERED
        elif anchor is not None and report.unanchored == 0 and not report.before_chain \
                and (checkpoints or not chains.entries):
            report.verdict = Verdict.VERIFIED
        return report, chains

    def _erased_runs(self, heads: dict[str, tuple[int, bytes]], tenant_of: dict[str, str],
                     chains: Chains) -> int:
        """Drop from ``heads`` the anchored runs that are gone because an
        erasure deleted them (its record keeps their keyed digests,
        ``api.erasure.run_digest``); how many. Any other run gone is still
        a run cut out of the history."""
        gone = [run for run in heads if run not in chains.heads]
        if not gone:
            return 0
        erased = self._store.erased_runs()
        dropped = 0
        for run in gone:
            owner = tenant_of[run]
            if owner in erased and run_digest(self._store, owner, run) in erased[owner]:
                del heads[run]
                dropped += 1
        return dropped

    def checkpoint(self, key: Path, *, tenant: str | None = None, anchor: Path | None = None,
                   now: float | None = None) -> list[dict[str, Any]]:
        """Sign each tenant's run heads (or ``tenant``'s), keep the records
        and append them to ``anchor``. Refused (``AuditRefused``) unless
        the history verifies, against ``anchor`` when it exists."""
        signer = auditanchor.load_private(key)
        pinned = auditanchor.public_hex(signer.public_key())
        existing = anchor if anchor is not None and anchor.exists() else None
        if existing is not None:
            auditanchor.latest(existing, pinned)  # one key per anchor
        report, chains = self._verify(tenant, None, existing, None)
        if report.problems:
            raise AuditRefused(f"not checkpointed: {report.summary()}")
        by_tenant: dict[str, dict[str, tuple[int, bytes]]] = {}
        for head in chains.heads.values():
            by_tenant.setdefault(head.tenant, {})[head.run_id] = (head.seq, head.link)
        if tenant is not None:
            by_tenant.setdefault(tenant, {})
        at = time.time() if now is None else now
        records = []
        for name, tenant_heads in sorted(by_tenant.items()):
            record = auditanchor.make_record(name, at, tenant_heads, signer)
            text = json.dumps(record, sort_keys=True, separators=(",", ":"))
            record["id"] = self._store.save_audit_checkpoint(name, at, text)  # type: ignore[attr-defined]
            if anchor is not None:
                auditanchor.append(anchor, {k: v for k, v in record.items() if k != "id"})
            records.append(record)
        return records

    def log(self, *, tenant: str | None = None, run_id: str | None = None, actor: str | None = None,
            event: str | None = None, since: float | None = None,
            limit: int | None = None, kind: str | None = None) -> list[AuditEvent]:
        """Who did what: every entry with its actor, oldest first (the last
        ``limit``), filtered by tenant, run, actor (a substring), event or
        operator action (a prefix), kind of object (``run``, ``token``,
        ``queue``...) and time. Operator log records come with the runs'
        entries unless ``run_id`` is given."""
        found: list[AuditEvent] = []
        items: Iterable[AuditEvent] = ()
        if kind in (None, "run"):
            rows = self._store.audit_entries(tenant=tenant, run_id=run_id)  # type: ignore[attr-defined]
            items = (event_of(row) for row in rows)
        if run_id is None and kind != "run" and hasattr(self._store, "operator_log"):
            records = (record_of(row) for row in self._store.operator_log(tenant=tenant))
            items = itertools.chain(items, (r for r in records if kind is None or r.kind == kind))
        for item in items:
            if actor is not None and actor not in item.actor:
                continue
            if event is not None and not item.event.startswith(event):
                continue
            if since is not None and item.at < since:
                continue
            found.append(item)
        found.sort(key=lambda e: (e.at, e.run_id, e.seq))
        return found[-limit:] if limit else found


def record_of(row: tuple[Any, ...]) -> AuditEvent:
    """The log's view of an operator log row (``oplog.COLUMNS``)."""
    try:
        change = json.loads(row[8])
    except (ValueError, TypeError):
        change = {"damaged": str(row[8])[:200]}
    return AuditEvent(float(row[2]), str(row[0]), oplog.chain_id(str(row[0])), int(row[1]), str(row[5]),
                      str(row[6]), str(row[7]), change if isinstance(change, dict) else {"value": change},
                      kind=str(row[3]), object_id=str(row[4]))


def event_of(row: tuple[Any, ...]) -> AuditEvent:
    """The log's view of a stored entry (``auditsql.ENTRY_COLUMNS``). A
    sealed detail shows only its plaintext keys (the actor is one)."""
    detail: Any = None
    if row[14] is not None:
        try:
            detail = json.loads(row[14])
        except (ValueError, TypeError):
            detail = {"damaged": str(row[14])[:200]}
    if not isinstance(detail, dict):
        detail = None if detail is None else {"value": detail}
    who, auth = actor_of(str(row[2]), row[5], int(row[4]), detail)
    return AuditEvent(float(row[3]), str(row[17]), str(row[0]), int(row[1]), str(row[2]), who, auth, detail)


def actor_of(event: str, worker: Any, epoch: int, detail: dict[str, Any] | None) -> tuple[str, str]:
    """Who wrote an entry and how they were authenticated: a run's starter
    (its ``run.created`` entry's ``started_by``), an operator's
    (``detail.actor``; the prefix says how: ``cli:`` the OS user, ``user:``
    a configured identity, ``http:`` an API token, ``app:`` a program
    in-process), a lease holder's (the worker, by its lease epoch), else the
    system's."""
    started = detail.get("started_by") if detail is not None and event == "run.created" else None
    if isinstance(started, dict) and isinstance(started.get("actor"), str):
        return str(started["actor"]), str(started.get("auth") or "unknown")
    if detail is not None and isinstance(detail.get("actor"), str):
        actor = str(detail["actor"])
        return actor, str(detail.get("auth") or AUTH.get(actor.partition(":")[0], "unknown"))
    if worker is not None:
        return f"worker:{worker}", f"lease epoch {epoch}"
    return "system", "none"


#: how each kind of operator actor was authenticated (its prefix)
AUTH = {"cli": "os-user", "user": "configured", "http": "api-token", "app": "in-process",
        "schedule": "schedule", "run": "parent-run"}
