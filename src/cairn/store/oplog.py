"""The operator log (issue 26 items 1-2): one append-only record per operator
mutation of an object that is not a run (an API token, a queue's limits or a
tenant's share, a schedule, a data key, a bundle, a retention policy...),
written in the transaction of the mutation and hash-chained per tenant.

Runs' history entries already carry their actor and chain per run
(``store.auditlinks``). These records chain the same way and with the same
functions, so the verifier, the signed checkpoints and the anchor treat a
tenant's operator log as one more chain: its id is ``CHAIN_PREFIX`` and the
tenant (percent-encoded, ``runids.id_part``), a name no run can take (a run
of tenant T may only take ids in that namespace that go on with ``T:``,
``runids.check_run_id``). Each record's link is::

    digest = SHA-256(msgpack([canonical JSON of the change, None]))
    link   = auditlinks.link(previous, [chain id, seq, action, at, 0, actor, 0,
                                        kind, object id, auth, 0, None, None], digest)

so editing any field (the actor and how it was authenticated among them),
deleting, inserting or reordering a record breaks the chain at it, and a cut
tail or a rolled-back database differs from the anchored head.

Why plain digests even under encryption: the change holds no secret and no
personal data (``record`` refuses the names of secret fields; a token's
secret, a key's material never reach it), only what an auditor reads.

Tenant ``""`` holds the installation's own objects (queue limits, retention
defaults, bundles a worker not scoped to a tenant stores); a bundle stored
when a run starts goes to that run's tenant's log (a tenant's PostgreSQL
role may append to its own log only).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from cairn.store.auditlinks import GENESIS, digest, link
from cairn.store.auditverify import Chains, Head
from cairn.store.runids import id_part

#: The chain id of a tenant's operator log begins so.
CHAIN_PREFIX = "operator-log:"

#: Field names a change may not hold, at any depth: secrets and key material
#: are never recorded (a caller passing one is a bug, refused loudly).
SECRET_FIELDS = frozenset({"secret", "token", "digest", "wrapped", "key", "material", "password",
                           "private_key"})

#: The kinds of object recorded (retention policies and others may add theirs).
KINDS = ("token", "queue", "queue_share", "schedule", "key", "bundle", "retention", "erasure", "archive")


def chain_id(tenant: str) -> str:
    """The id under which ``tenant``'s operator log chains and is anchored."""
    return CHAIN_PREFIX + id_part(tenant)


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """What an operator did: ``action`` (``token.mint``...) on the object
    ``kind``/``object_id`` of ``tenant``, by ``actor`` authenticated as
    ``auth``, and what changed (JSON values, no secrets)."""

    tenant: str
    kind: str
    object_id: str
    action: str
    actor: str
    auth: str
    change: Mapping[str, Any] = field(default_factory=dict)

    def canonical_change(self) -> str:
        """The change as canonical JSON (sorted keys, no spaces), refused if
        it names a secret field."""
        _refuse_secrets(self.change, "change")
        return json.dumps(self.change, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)


def _refuse_secrets(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for name, item in value.items():
            if str(name).lower() in SECRET_FIELDS:
                raise ValueError(f"an operator log record may not hold {where}.{name} (a secret)")
            _refuse_secrets(item, f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _refuse_secrets(item, where)


#: The columns of an ``operator_log`` row, in order.
COLUMNS = ("tenant", "seq", "at", "kind", "object_id", "action", "actor", "auth", "change", "digest", "link")


def meta(tenant: str, seq: int, at: float, kind: str, object_id: str, action: str, actor: str,
         auth: str) -> tuple[Any, ...]:
    """What a record's link covers besides its change, in the shape of a
    history entry's metadata (``auditlinks.link``)."""
    return (chain_id(tenant), seq, action, float(at), 0, actor, 0, kind, object_id, auth, 0, None, None)


def change_digest(change: str) -> bytes:
    """The digest of a record's canonical change."""
    return digest(change.encode("utf-8"), None)


def row_link(previous: bytes, row: tuple[Any, ...], record_digest: bytes) -> bytes:
    """The link after ``previous`` of a stored row (``COLUMNS``)."""
    return link(previous, meta(*row[:8]), record_digest)


def verify_into(chains: Chains, store: Any, *, tenant: str | None = None,
                want: Mapping[str, int] | None = None) -> int:
    """Verify the operator logs of ``store`` (of ``tenant``, or all) and add
    them to ``chains`` as chains of their own (``chain_id``): their records
    counted as entries, their heads beside the runs' (so checkpoints sign
    and anchors check them), their first problems named. ``want``: chain id
    -> seq, as for the runs. How many records there were."""
    by_tenant = {tenant_of_chain(c): seq for c, seq in (want or {}).items() if is_chain(c)}
    found: dict[str, bytes] = {}
    count, heads, problems = verify_rows(store.operator_log(tenant=tenant), by_tenant, found)
    chains.entries += count
    for name, (seq, head) in heads.items():
        chains.heads[chain_id(name)] = Head(chain_id(name), name, seq, head)
    for name, head in found.items():
        chains.found[chain_id(name)] = head
    for problem in problems:
        chains.fail(chain_id(problem.tenant), problem.seq, f"operator log: {problem.what}")
    return count


def is_chain(name: str) -> bool:
    """Whether a chain id is an operator log's (a run's never is: see the module doc)."""
    return name.startswith(CHAIN_PREFIX) and ":" not in name[len(CHAIN_PREFIX):]


def tenant_of_chain(chain: str) -> str:
    """The tenant whose operator log ``chain`` is (``chain_id``'s inverse)."""
    return urllib.parse.unquote(chain[len(CHAIN_PREFIX):])


@dataclass(frozen=True, slots=True)
class LogProblem:
    """The first bad record of a tenant's operator log."""

    tenant: str
    seq: int | None
    what: str


def verify_rows(rows: Iterable[tuple[Any, ...]], want: Mapping[str, int] | None = None,
                found: dict[str, bytes] | None = None) -> tuple[int, dict[str, tuple[int, bytes]],
                                                                 list[LogProblem]]:
    """Check every row (``COLUMNS``, in ``(tenant, seq)`` order): how many,
    each tenant's head (seq, link) and the first problem of each broken
    tenant (whose head is then left out). ``want``: tenant -> the seq whose
    link to put in ``found`` (an anchored head's)."""
    wanted = want or {}
    count = 0
    heads: dict[str, tuple[int, bytes]] = {}
    problems: list[LogProblem] = []
    broken: set[str] = set()
    tenant = ""
    previous, expected = GENESIS, 1
    for row in rows:
        count += 1
        if count == 1 or row[0] != tenant:
            tenant, previous, expected = str(row[0]), GENESIS, 1
        if tenant in broken:
            continue
        seq = int(row[1])
        problem = _problem(row, seq, expected, previous)
        if problem is not None:
            broken.add(tenant)
            heads.pop(tenant, None)
            problems.append(LogProblem(tenant, expected if seq > expected else seq, problem))
            continue
        previous, expected = bytes(row[10]), seq + 1
        heads[tenant] = (seq, previous)
        if found is not None and wanted.get(tenant) == seq:
            found[tenant] = previous
    return count, heads, problems


def _problem(row: tuple[Any, ...], seq: int, expected: int, previous: bytes) -> str | None:
    if seq != expected:
        return (f"records {expected} to {seq - 1} are missing (deleted)" if seq > expected + 1
                else f"record {expected} is missing (deleted)" if seq > expected
                else "the record is out of order (reordered or duplicated)")
    change, stored_digest = row[8], bytes(row[9] or b"")
    try:
        json.loads(change)
    except (TypeError, ValueError):
        return "the record's change is not JSON (damaged)"
    if change_digest(str(change)) != stored_digest:
        return "the record's change differs from the digest recorded when it was written (edited)"
    if row_link(previous, row, stored_digest) != bytes(row[10] or b""):
        return ("the record does not match its link: its actor, authentication, time, action or object was "
                "edited, it was inserted or moved, or a record before it was rewritten")
    return None


#: how each kind of actor was authenticated (its prefix)
AUTH = {"cli": "os-user", "user": "configured", "http": "api-token", "app": "in-process",
        "schedule": "schedule", "run": "parent-run", "worker": "lease", "system": "system"}

#: the actor of a move no operator named (a store method called without ``actor``)
SYSTEM_ACTOR = "system:store"


def auth_of(actor: str) -> str:
    """How the actor ``actor`` was authenticated, from its prefix."""
    return AUTH.get(actor.partition(":")[0], "unknown")


def acting(store: Any, actor: str, tenant: str, kind: str, object_id: str, action: str,
           change: Mapping[str, Any] | None = None, auth: str | None = None) -> AbstractContextManager[None]:
    """The context in which ``store``'s next recording mutation adds an
    operator log record (``store.oplogsql``) of ``action`` by ``actor``
    (authenticated as ``auth`` says, by default its prefix) on ``kind``/``object_id`` of
    ``tenant``, in the mutation's own transaction. A store without an
    operator log (none of Cairn's) records nothing. Here, in the store's
    layer, so that a worker (below the API) records its actions too."""
    method = getattr(store, "acting", None)
    if method is None:
        return nullcontext()
    context_manager: AbstractContextManager[None] = method(
        OperatorAction(tenant, kind, object_id, action, actor, auth or auth_of(actor), dict(change or {})))
    return context_manager
