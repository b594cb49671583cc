"""Retention policies as pure rules (issue 26 part 3): what a policy is, which
one applies to a row, and which policy sets are refused.

A policy keeps one *data class* of one tenant (``*``: every tenant without
a policy of its own) and one workflow (``*``: every workflow) for ``keep``
seconds (``None``: forever). For a row, the most specific policy of its
class decides: ``(tenant, workflow)``, then ``(tenant, *)``, then
``(*, workflow)``, then ``(*, *)``; no policy at all keeps it (retention is
opt-in: nothing goes unless a policy says so).

The classes, and what "goes" means for each (``api.retention`` enforces them,
every deletion through a store method that checks the controller's fence):

``history``         finished run trees (the run rows, their journals, and what the
                    run deletion path takes with them: ``Store.prune_runs``)
``model-bodies``    the bodies of finished runs' recorded model calls; the
                    journal entry and its audit digest stay (``EXPIRED_TAG``)
``artifacts``       the bodies of finished runs' entries stored by reference
                    (the artifact store); the entry and its digest stay
``thread-memory``   thread messages older than the period, and threads left empty
``kv-memory``       long-term items without index text not written for the period
``semantic-memory`` long-term items with index text (searchable), with their vectors
``audit``           the records of deleted runs (``retention_deleted``)
``archives``        run archives (the archive tier; nothing to do where there is none)

Memory belongs to a tenant's threads and namespaces, not to a workflow: a
memory policy names no workflow. Audit records must outlive the history
they cover: ``check`` refuses a set of policies where, for any tenant and
workflow, the audit policy that applies keeps less than the history policy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from cairn.errors import InvalidArgument

#: every tenant, or every workflow, without a policy of its own
ANY = "*"

#: The first bytes of a history payload whose body retention removed (the
#: journal entry, its ``payload_ref`` and its audit digest stay). A reader
#: that meets it raises a ``PayloadError`` saying so (``codec.payloads``); the
#: audit verifier counts the entry as EXPIRED (``store.auditverify``).
EXPIRED_TAG = b"\x00\x03"


class DataClass(StrEnum):
    HISTORY = "history"
    MODEL_BODIES = "model-bodies"
    ARTIFACTS = "artifacts"
    THREAD_MEMORY = "thread-memory"
    KV_MEMORY = "kv-memory"
    SEMANTIC_MEMORY = "semantic-memory"
    AUDIT = "audit"
    ARCHIVES = "archives"

    @property
    def per_workflow(self) -> bool:
        """Whether the class's rows belong to a workflow's runs (memory does not)."""
        return self not in MEMORY_CLASSES


MEMORY_CLASSES = frozenset({DataClass.THREAD_MEMORY, DataClass.KV_MEMORY, DataClass.SEMANTIC_MEMORY})

_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,200}")


@dataclass(frozen=True, slots=True)
class Policy:
    """Keep ``data_class`` of ``tenant``'s runs of ``workflow`` for ``keep``
    seconds (``None``: forever), as set by ``updated_by`` at ``updated_at``."""

    tenant: str
    workflow: str
    data_class: DataClass
    keep: float | None
    updated_at: float = 0.0
    updated_by: str = ""

    @property
    def scope(self) -> tuple[str, str, DataClass]:
        return (self.tenant, self.workflow, self.data_class)

    def describe(self) -> str:
        return (f"{self.data_class} of tenant {self.tenant} workflow {self.workflow}: "
                f"keep {format_keep(self.keep)}")


def data_class(raw: str) -> DataClass:
    """The class named ``raw``; ``InvalidArgument`` naming the known ones."""
    try:
        return DataClass(raw)
    except ValueError:
        known = ", ".join(c.value for c in DataClass)
        raise InvalidArgument(f"unknown data class {str(raw)[:60]!r} (one of: {known})") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdwy])")


def parse_keep(text: str) -> float | None:
    """A period as the CLI takes it: ``30d``, ``12h``, ``1y``, ``90`` (seconds),
    or ``forever`` (``None``); anything else (negative, garbage, not finite)
    is an ``InvalidArgument`` naming it."""
    raw = str(text).strip().lower()
    if raw == "forever":
        return None
    match = _DURATION.fullmatch(raw)
    if match is not None:
        return float(match.group(1)) * _UNITS[match.group(2)]
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if raw.startswith("-") or (seconds < 0):
        raise InvalidArgument(f"a retention period cannot be negative: {str(text)[:60]!r}")
    if not math.isfinite(seconds):
        raise InvalidArgument(f"not a retention period: {str(text)[:60]!r} (use e.g. 30d, 12h, 1y, 3600 or "
                              "'forever')")
    return seconds


def format_keep(keep: float | None) -> str:
    """``keep`` as people read it: ``forever``, ``30d``, ``12h``, ``90s``."""
    if keep is None:
        return "forever"
    for unit in ("y", "d", "h", "m"):
        if keep >= _UNITS[unit] and keep % _UNITS[unit] == 0:
            return f"{int(keep // _UNITS[unit])}{unit}"
    return f"{keep:g}s"


def policy(tenant: str | None, workflow: str | None, cls: str, keep: float | str | None, *,
           updated_at: float = 0.0, updated_by: str = "") -> Policy:
    """A checked policy: a known class, a tenant and workflow name (``None``:
    ``*``) of 1-200 printable characters, a period neither negative nor NaN,
    no workflow for a memory class. ``InvalidArgument`` (one line) otherwise."""
    kind = data_class(cls)
    scope_tenant = ANY if tenant is None else str(tenant)
    scope_workflow = ANY if workflow is None else str(workflow)
    for what, name in (("tenant", scope_tenant), ("workflow", scope_workflow)):
        if not _NAME.fullmatch(name):
            raise InvalidArgument(f"a policy's {what} must be 1 to 200 characters without control characters")
    if scope_workflow != ANY and not kind.per_workflow:
        raise InvalidArgument(f"{kind} belongs to a tenant's threads and namespaces, not to a workflow: "
                              "its policy takes a tenant only")
    if isinstance(keep, str):
        kept = parse_keep(keep)
    elif keep is None:
        kept = None
    else:
        if isinstance(keep, bool) or not isinstance(keep, int | float) or not math.isfinite(keep):
            raise InvalidArgument(f"not a retention period: {keep!r}")
        if keep < 0:
            raise InvalidArgument(f"a retention period cannot be negative: {keep!r}")
        kept = float(keep)
    return Policy(scope_tenant, scope_workflow, kind, kept, updated_at, updated_by)


def effective(policies: Iterable[Policy], cls: DataClass, tenant: str, workflow: str) -> Policy | None:
    """The policy that decides for rows of ``cls`` of (``tenant``, ``workflow``)."""
    best: tuple[int, Policy] | None = None
    for p in policies:
        if p.data_class is not cls:
            continue
        if p.tenant not in (tenant, ANY) or p.workflow not in (workflow, ANY):
            continue
        rank = (2 if p.tenant == tenant and tenant != ANY else 0) + \
            (1 if p.workflow == workflow and workflow != ANY else 0)
        if best is None or rank > best[0]:
            best = (rank, p)
    return None if best is None else best[1]


def _kept(found: Policy | None) -> float:
    return math.inf if found is None or found.keep is None else found.keep


def check(policies: Sequence[Policy]) -> None:
    """``InvalidArgument`` unless audit records outlive the history they
    cover for every tenant and workflow the policies name (and every other:
    ``*``). No history policy keeps history forever, so an audit policy
    needs one at most as long."""
    tenants = {p.tenant for p in policies} | {ANY}
    workflows = {p.workflow for p in policies} | {ANY}
    for tenant in sorted(tenants):
        for workflow in sorted(workflows):
            history = effective(policies, DataClass.HISTORY, tenant, workflow)
            audit = effective(policies, DataClass.AUDIT, tenant, workflow)
            if _kept(audit) < _kept(history):
                where = ("every tenant" if tenant == ANY else f"tenant {tenant}") + \
                    ("" if workflow == ANY else f", workflow {workflow}")
                history_keep = (format_keep(history.keep) if history is not None
                                else "forever (no history policy)")
                assert audit is not None
                raise InvalidArgument(
                    f"audit records of {where} would be kept {format_keep(audit.keep)}, less than the run "
                    f"history they cover ({history_keep}): an audit policy must keep at least as long as the "
                    "history's")


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """When rows of one class are due, per (tenant, workflow), as of ``now``:
    a row of that scope last changed before ``of(...)`` goes."""

    cls: DataClass
    policies: tuple[Policy, ...]
    now: float

    def of(self, tenant: str, workflow: str = ANY) -> float | None:
        """The cutoff for rows of (``tenant``, ``workflow``); ``None``: kept."""
        found = effective(self.policies, self.cls, tenant, workflow)
        if found is None or found.keep is None:
            return None
        return self.now - found.keep

    def due(self, tenant: str, workflow: str, at: float) -> bool:
        """Whether a row of this scope last changed at ``at`` goes."""
        cut = self.of(tenant, workflow)
        return cut is not None and at < cut

    @property
    def latest(self) -> float | None:
        """The latest cutoff of any policy (``None``: nothing can go): no row
        changed at or after it is due, whatever its scope."""
        cuts = [self.now - p.keep for p in self.policies if p.data_class is self.cls and p.keep is not None]
        return max(cuts) if cuts else None


def cutoffs(policies: Iterable[Policy], cls: DataClass, now: float) -> Cutoffs:
    return Cutoffs(cls, tuple(p for p in policies if p.data_class is cls), now)


def expired_marker(cls: DataClass, now: float) -> bytes:
    """The stored payload of an entry whose body ``cls``'s policy removed at ``now``."""
    return EXPIRED_TAG + f"{cls.value}@{now:.3f}".encode()


def expired_reason(stored: bytes) -> str | None:
    """Why a stored payload is gone (``None``: it is not an expired marker)."""
    if stored[:2] != EXPIRED_TAG:
        return None
    cls, _, at = stored[2:].decode(errors="replace").partition("@")
    try:
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(at)))
    except (ValueError, OverflowError):
        when = "an unknown time"
    return (f"its body expired under the {cls} retention policy at {when} (the journal entry and its "
            "audit digest remain; the body cannot be read or replayed)")


__all__ = [
    "ANY",
    "EXPIRED_TAG",
    "MEMORY_CLASSES",
    "Cutoffs",
    "DataClass",
    "Policy",
    "check",
    "cutoffs",
    "data_class",
    "effective",
    "expired_marker",
    "expired_reason",
    "format_keep",
    "parse_keep",
    "policy",
]
