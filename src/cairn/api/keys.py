"""Encryption keys of an App's database: status, rotation, re-encryption, verification.

What ``cairn keys`` does, on the App's sealed store (``cairn.store.sealed``):

* ``status``: each tenant's data key versions (the KEK wrapping each) and
  how many of its values each version seals: a re-encryption's progress;
* ``rotate``: a new data key version for a tenant (or every tenant), which
  seals new writes at once; ``rewrap``: KEK rotation, every data key wrapped
  again by the keyring's current KEK (no value is re-encrypted);
* ``reencrypt``: passes that move a tenant's values and artifacts to its
  newest key (``cairn.store.rekey``: compare-and-set, resumable, throttled);
* ``verify``: open every sealed value of runs, entries and messages, and
  every artifact the tenant's rows name, and report any that does not open,
  by place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from cairn.api.actors import acting, auth_of
from cairn.errors import ConfigError, PayloadError
from cairn.security.envelope import SealError
from cairn.store.oplog import OperatorAction
from cairn.store.records import RunFilter
from cairn.store.rekey import Progress, Rekeyer
from cairn.store.sealed import SealedStore


@dataclass(frozen=True, slots=True)
class KeyVersion:
    version: int
    kek_id: str
    created_at: float


@dataclass(frozen=True, slots=True)
class TenantKeys:
    """A tenant's keys and what each seals (``values``: version -> count)."""

    tenant: str
    versions: list[KeyVersion]
    values: dict[int, int]
    old: int
    #: artifacts on older keys (``reencrypt`` moves them too)
    old_artifacts: int = 0
    #: artifacts per key version (0: plaintext, stored before encryption was on)
    artifacts: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """What ``cairn keys status --json`` prints and ``GET /api/keys``
        answers: ids, versions and counts (a key's material is never here)."""
        return {"tenant": self.tenant, "versions": [{"version": v.version, "kek": v.kek_id,
                                                     "created_at": v.created_at} for v in self.versions],
                "values": {str(k): n for k, n in self.values.items()}, "old": self.old,
                "old_artifacts": self.old_artifacts,
                "artifacts": {str(k): n for k, n in self.artifacts.items()}}


@dataclass(slots=True)
class Verified:
    tenant: str
    runs: int = 0
    failures: list[str] = field(default_factory=list)
    artifacts: int = 0


def sealed_store(store: Any) -> SealedStore:
    """The App's store if encryption is on; ``ConfigError`` (one line) if not."""
    if not isinstance(store, SealedStore):
        raise ConfigError("encryption at rest is off for this database: give a keyring "
                          "(App(keyring=...) or $CAIRN_KEYRING=file:/path | env:VARIABLE)")
    return store


def owner_only(store: SealedStore, what: str) -> None:
    """``ConfigError`` (one line) unless the store's role passes row-level
    security by (PostgreSQL's owner; SQLite has no roles): a pass rewrites
    every tenant's artifacts, which a tenant's role may add, never rewrite,
    and a tenant's role sees only its own rows, so it would fail half-way."""
    inner: Any = store.inner
    if getattr(inner, "owner_role", True) is False:
        raise ConfigError(f"{what} takes the database owner's role: this connection is a tenant's role "
                          "(row-level security); connect as the owner")


class Keys:
    """``cairn keys`` over one App's store."""

    def __init__(self, store: Any, actor: str | None = None) -> None:
        self.store = sealed_store(store)
        #: who rotates keys (the operator log's actor; default: this program)
        self.actor = actor or f"app:{os.getpid()}"

    def tenants(self, tenant: str | None = None) -> list[str]:
        return [tenant] if tenant is not None else self.store.keys.tenants()

    def status(self, tenant: str | None = None) -> list[TenantKeys]:
        found = []
        for name in self.tenants(tenant):
            rows = self.store.inner.data_keys(name)  # type: ignore[attr-defined]
            progress = self.store.key_status(name)
            found.append(TenantKeys(name, [KeyVersion(r.version, r.kek_id, r.created_at) for r in rows],
                                    dict(sorted(progress.versions.items())), progress.old,
                                    progress.old_artifacts, dict(sorted(progress.artifacts.items()))))
        return found

    def rotate(self, tenant: str | None = None) -> list[tuple[str, int]]:
        done = []
        for name in self.tenants(tenant):
            with acting(self.store, self.actor, name, "key", name, "key.rotate"):
                done.append((name, self.store.rotate(name)))
        return done

    def rewrap(self) -> int:
        """KEK rotation (``SealedStore.rewrap``): each data key rewrapped is
        recorded in its tenant's operator log (``key.rewrap``: the version
        and both KEK ids), in the transaction that rewraps it."""
        with acting(self.store, self.actor, "", "key", "", "key.rewrap"):
            return self.store.rewrap()

    def reencrypt(self, tenant: str | None = None, *, pause: float = 0.0, page: int = 200) -> list[Progress]:
        """One re-encryption pass per tenant; a pass that moved anything is
        recorded in the tenant's operator log (``key.reencrypt``) once done:
        a pass is many transactions, and a killed one is taken up again by
        the next, which records what it moved then."""
        owner_only(self.store, "cairn keys reencrypt")
        done = []
        for name in self.tenants(tenant):
            progress = self.store.reencrypt(name, pause=pause, page=page)
            self._record_pass(name, "key.reencrypt", progress)
            done.append(progress)
        return done

    def _record_pass(self, tenant: str, action: str, progress: Progress) -> None:
        if not (progress.moved or progress.artifacts_moved):
            return  # nothing changed: nothing to record
        record: Any = getattr(self.store.inner, "append_operator_action", None)
        if record is not None:
            change = {"newest": progress.newest, "moved": progress.moved,
                      "artifacts_moved": progress.artifacts_moved}
            record(OperatorAction(tenant, "key", tenant, action, self.actor, auth_of(self.actor), change))

    def adopt(self, *, pause: float = 0.0, page: int = 200, passes: int = 10) -> list[Progress]:
        """Turn encryption on for a database written without it: mark it as
        adopting (plaintext values are read as they are meanwhile, and only
        then), seal every tenant's plaintext values in passes (new writes are
        sealed already), and end the adoption once a pass finds none left:
        from then on plaintext is refused. Refused (``ConfigError``) while a
        row names an artifact: artifacts are not adopted yet."""
        inner: Any = self.store.inner
        owner_only(self.store, "cairn keys adopt")
        if inner.rekey_page("rekey_any_artifact_page", {}):
            raise ConfigError("this database holds artifacts (values over the inline limit), which "
                              "adoption does not seal yet: not adopted")
        self.store.keys.start_adoption()
        for _ in range(passes):
            tenants: list[str] = []
            while rows := inner.rekey_page("rekey_tenants_page", {"after": tenants[-1] if tenants else "",
                                                                   "limit": 500}):
                tenants += [str(r[0]) for r in rows]
            done = [Rekeyer(self.store, t, page=page, pause=pause, adopt=True).run() for t in tenants]
            for progress in done:
                self._record_pass(progress.tenant, "key.adopt", progress)
            check = [Rekeyer(self.store, t, adopt=True, move=False).run() for t in tenants]
            if not any(p.versions[0] for p in check):
                self.store.keys.end_adoption()
                return done
        raise ConfigError(f"plaintext values were still being written after {passes} passes: "
                          "adoption goes on (run 'cairn keys adopt' again)")

    def verify(self, tenant: str | None = None, *, limit: int = 1_000_000) -> list[Verified]:
        """Each tenant's runs read as a worker reads them (record, history,
        messages), then every sealed column opened at its place by a
        verifying pass (``Rekeyer(verify=True)``: the pages a re-encryption
        moves, so memory, decision comments, workspace objects and LangGraph
        checkpoints too), then every artifact its rows name. A failure found
        both ways is listed once."""
        reports = []
        for name in self.tenants(tenant):
            report = Verified(name)
            inner: Any = self.store.inner
            for run in inner.list_runs(RunFilter(tenant=name, limit=limit)):
                report.runs += 1
                for read in (self.store.get_run, self.store.history, self.store.deliveries):
                    try:
                        read(run.run_id)
                    except SealError as exc:
                        report.failures.append(str(exc))
            report.failures += Rekeyer(self.store, name, verify=True).run().failures
            self._verify_artifacts(report)
            report.failures = list(dict.fromkeys(report.failures))
            reports.append(report)
        return reports

    def _verify_artifacts(self, report: Verified) -> None:
        """Open every artifact the tenant's rows name (one missing is a failure too)."""
        inner: Any = self.store.inner
        after = ""
        while rows := inner.rekey_page("rekey_artifact_refs_page", {"tenant": report.tenant, "after": after,
                                                                     "limit": 200}):
            for (ref,) in rows:
                report.artifacts += 1
                try:
                    self.store.artifacts.open(report.tenant, ref, inner.read_artifact(ref))
                except PayloadError as exc:  # SealError included
                    report.failures.append(f"artifact {ref}: {exc}")
            after = rows[-1][0]
