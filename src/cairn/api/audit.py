"""The audit log (issue 26): verify the chains against an anchor, sign and
export checkpoints, and show who did what.

``Audit.verify`` gives one of three verdicts (``api.auditchain``): never a
plain pass without an anchor. ``Audit.checkpoint`` signs each tenant's run
heads only after verifying them (against the anchor too, when one is given:
a database rolled back is never re-anchored in its rolled-back state).
``Audit.log`` lists the entries with their actor: an operator's
(``detail.actor``), the starter recorded in a ``run.created`` entry
(``detail.started_by``), a worker's lease (``worker``, ``epoch``), or the
system.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from cairn.api import auditanchor
from cairn.api.actors import auth_of
from cairn.api.auditanchor import Checkpoint
from cairn.api.auditchain import Chains, Problem, verify_chains
from cairn.errors import InvalidArgument
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
    problems: list[Problem] = field(default_factory=list)
    #: tenant -> time of the checkpoint verified against
    anchors: dict[str, float] = field(default_factory=dict)
    #: runs the anchor has that an operator pruned since
    pruned: list[str] = field(default_factory=list)

    @property
    def unanchored(self) -> int:
        return self.entries - self.anchored

    def summary(self) -> str:
        """The verdict and why, in one line."""
        counted = f"{self.entries} entries of {self.runs} runs"
        if self.verdict is Verdict.TAMPERED:
            more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            return f"TAMPERED: {self.problems[0]}{more}"
        if self.verdict is Verdict.VERIFIED:
            return f"VERIFIED: {counted}, all covered by the anchor ({_when(self.anchors)})"
        if not self.anchors:
            return (f"UNANCHORED: {counted} hold together as chains, but no exported checkpoint covers them "
                    f"(run 'cairn audit checkpoint --anchor FILE', then verify with --anchor FILE)")
        return (f"UNANCHORED: {counted} hold together; verified against the anchor ({_when(self.anchors)}) "
                f"up to its checkpoint: {self.unanchored} newer entries are verified only as a chain")

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "entries": self.entries, "runs": self.runs,
                "anchored": self.anchored, "unanchored": self.unanchored,
                "problems": [{"run_id": p.run_id, "seq": p.seq, "problem": p.what} for p in self.problems],
                "anchors": self.anchors, "pruned": self.pruned, "summary": self.summary()}


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

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "tenant": self.tenant, "run_id": self.run_id, "seq": self.seq,
                "event": self.event, "actor": self.actor, "auth": self.auth, "detail": self.detail}


class Audit:
    """The audit operations on one store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    # -- verification -------------------------------------------------------------------------

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
        want = {run: seq for c in checkpoints.values() for run, (seq, _) in c.heads.items()
                if run_id is None or run == run_id}
        chains: Chains = self._store.audit_scan(
            lambda entries, links, has_links: verify_chains(entries, links, has_links, want),
            tenant=tenant, run_id=run_id)

        def pruned(run: str) -> int | None:
            tomb = self._store.audit_pruned(run_id=run)
            return int(tomb[0][2]) if tomb else None

        return judge(chains, checkpoints, anchor is not None, run_id, pruned), chains

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self, key: Path, *, tenant: str | None = None, anchor: Path | None = None,
                   now: float | None = None) -> list[dict[str, Any]]:
        """Sign each tenant's run heads (or ``tenant``'s), keep the records
        and append them to ``anchor``. Refused (``AuditRefused``) unless
        the history verifies, against ``anchor`` when it exists."""
        signer = auditanchor.load_private(key)
        pinned = auditanchor.public_hex(signer.public_key())
        existing = anchor if anchor is not None and anchor.exists() else None
        report, chains = self._verify(tenant, None, existing, None)
        if report.problems:
            raise AuditRefused(f"not checkpointed: {report.summary()}")
        if existing is not None:
            auditanchor.latest(existing, pinned)  # one key per anchor
        heads = chains.heads
        by_tenant: dict[str, dict[str, tuple[int, bytes]]] = {}
        for head in heads.values():
            by_tenant.setdefault(head.tenant, {})[head.run_id] = (head.seq, head.link)
        if tenant is not None:
            by_tenant.setdefault(tenant, {})
        at = time.time() if now is None else now
        records = []
        for name, tenant_heads in sorted(by_tenant.items()):
            record = auditanchor.make_record(name, at, tenant_heads, signer)
            text = json.dumps(record, sort_keys=True, separators=(",", ":"))
            record["id"] = self._store.save_audit_checkpoint(name, at, text)
            if anchor is not None:
                auditanchor.append(anchor, {k: v for k, v in record.items() if k != "id"})
            records.append(record)
        return records

    # -- the log ----------------------------------------------------------------------------------

    def log(self, *, tenant: str | None = None, run_id: str | None = None, actor: str | None = None,
            event: str | None = None, since: float | None = None,
            limit: int | None = None) -> list[AuditEvent]:
        """Who did what: every entry with its actor, oldest first (the last
        ``limit``), filtered by tenant, run, actor (a substring), event
        (a prefix) and time."""

        def collect(entries: Iterator[tuple[Any, ...]], *_: Any) -> list[AuditEvent]:
            found: list[AuditEvent] = []
            for row in entries:
                item = event_of(row)
                if actor is not None and actor not in item.actor:
                    continue
                if event is not None and not item.event.startswith(event):
                    continue
                if since is not None and item.at < since:
                    continue
                found.append(item)
            return found

        found = self._store.audit_scan(collect, tenant=tenant, run_id=run_id)
        found.sort(key=lambda e: (e.at, e.run_id, e.seq))
        return found[-limit:] if limit else found


def judge(chains: Chains, checkpoints: dict[str, Checkpoint], anchored: bool, run_id: str | None,
          pruned: Callable[[str], int | None]) -> Report:
    """The verdict on ``chains`` (``verify_chains``, fed the heads the
    ``checkpoints`` recorded) against those checkpoints; ``anchored``:
    whether an anchor was given at all; ``pruned(run)``: the last seq of a
    run an operator pruned (``None``: not pruned)."""
    report = Report(Verdict.UNANCHORED, chains.entries, len(chains.heads), problems=list(chains.problems))
    report.anchors = {t: c.at for t, c in checkpoints.items()}
    for checkpoint in checkpoints.values():
        _against(checkpoint, chains, run_id, pruned, report)
    if report.problems:
        report.verdict = Verdict.TAMPERED
    elif anchored and report.unanchored == 0 and (checkpoints or not chains.entries):
        report.verdict = Verdict.VERIFIED
    return report


def _against(checkpoint: Checkpoint, chains: Chains, run_id: str | None, pruned: Callable[[str], int | None],
             report: Report) -> None:
    """Compare the chains with one anchored checkpoint: each head it
    recorded must still be there, unchanged (else the tail was dropped, the
    database rolled back, or the history rewritten and relinked)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(checkpoint.at))
    for run, (seq, anchored) in sorted(checkpoint.heads.items()):
        if run_id is not None and run != run_id:
            continue
        head = chains.heads.get(run)
        if head is None:
            last = pruned(run)
            if last is not None and last >= seq:
                report.pruned.append(run)
            else:
                _add(report, Problem(run, None, f"the run is gone: the anchor of {stamp} has it at entry "
                                                f"{seq}, and it was not pruned"))
            continue
        if head.tenant != checkpoint.tenant:
            _add(report, Problem(run, seq, f"the run is now of tenant {head.tenant!r}, anchored as of "
                                           f"{checkpoint.tenant!r}"))
        elif head.seq < seq:
            _add(report, Problem(run, head.seq + 1,
                                 f"the anchor of {stamp} has entries up to {seq}, only {head.seq} remain "
                                 f"(the tail was cut, or the database rolled back)"))
        elif chains.found.get(run) != anchored:
            _add(report, Problem(run, seq, f"the entry differs from the one anchored on {stamp} (the "
                                           f"history was rewritten and relinked, or rolled back)"))
        else:
            report.anchored += seq


def _add(report: Report, problem: Problem) -> None:
    if all(p.run_id != problem.run_id for p in report.problems):
        report.problems.append(problem)


def event_of(row: tuple[Any, ...]) -> AuditEvent:
    """The log's view of a stored entry (``auditlinks.AUDIT_COLUMNS``)."""
    detail: Any = None
    if row[15] is not None:
        try:
            detail = json.loads(row[15])
        except (ValueError, TypeError):
            detail = {"damaged": str(row[15])[:200]}
    if not isinstance(detail, dict):
        detail = None if detail is None else {"value": detail}
    who, auth = actor_of(str(row[3]), row[6], int(row[5]), detail)
    return AuditEvent(float(row[4]), str(row[2]), str(row[0]), int(row[1]), str(row[3]), who, auth, detail)


def actor_of(event: str, worker: Any, epoch: int, detail: dict[str, Any] | None) -> tuple[str, str]:
    """Who wrote an entry and how they were authenticated."""
    if detail is not None:
        started = detail.get("started_by") if event == "run.created" else None
        if isinstance(started, dict) and isinstance(started.get("actor"), str):
            return started["actor"], str(started.get("auth") or auth_of(started["actor"]))
        if isinstance(detail.get("actor"), str):
            return detail["actor"], str(detail.get("auth") or auth_of(detail["actor"]))
    if worker is not None:
        return f"worker:{worker}", f"lease epoch {epoch}"
    return "system", "none"
