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
entries with their actor, a page at a time (``auditlog``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from cairn.api import auditanchor, auditlog
from cairn.api.auditlog import AuditEvent, LogFilter, LogPage
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
        entries unless ``run_id`` is given. The last ``limit`` are read
        newest first and stop there (``auditlog``), not the whole log."""
        wanted = LogFilter(tenant, run_id, actor, event, since, kind)
        if limit:
            return auditlog.page(self._store, wanted, limit, newest=True).entries[::-1]
        return list(auditlog.entries(self._store, wanted, None, newest=False))

    def log_page(self, wanted: LogFilter, limit: int, *, after: str | None = None,
                 newest: bool = True) -> LogPage:
        """One page of the log: at most ``limit`` entries past the cursor
        ``after`` (a page's ``next_after``), newest first unless ``newest``
        is false. A cursor that is not one is ``InvalidArgument``."""
        return auditlog.page(self._store, wanted, limit, newest=newest,
                             after=None if after is None else auditlog.position_of(after))
