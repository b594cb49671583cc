"""Checking the audit chain (issue 26): every stored entry against its
digest and its link (``store.auditlinks``), one pass in ``(run_id, seq)``
order, and each run's head (its last ``seq`` and link) for the signed
checkpoints that anchor them (``api.auditanchor``).

What a pass catches by itself: an entry whose plaintext (payload, detail)
or metadata (type, time, worker, epoch: the actor, position, name...) was
edited, one inserted, deleted or moved (its successor's link no longer
follows), one copied from another run (the run id is in the link), a
ciphertext edited (it no longer opens), an entry of another tenant's. What
it cannot catch alone: the tail cut off, the whole database rolled back to
a copy, or a run rewritten and every link after the edit recomputed (the
hash is keyless). A head recorded outside the database catches those; the
caller compares the heads found here with the anchored ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from cairn.security.envelope import SealError
from cairn.store.auditkeys import KeyGone
from cairn.store.auditlinks import (
    GENESIS,
    PENDING,
    Digester,
    digest,
    digest_v3,
    link_version,
    plain_digest,
    row_link,
)
from cairn.store.retention import EXPIRED_TAG
from cairn.store.rows import DamagedRow, event_from_row, unpack_payload

_decode_json = msgspec.json.decode

#: How many problems a report keeps (the first is the verdict's).
MAX_PROBLEMS = 100


@dataclass(frozen=True, slots=True)
class Problem:
    """The first bad entry of a run, and what is wrong with it."""

    run_id: str
    seq: int | None
    what: str

    def __str__(self) -> str:
        where = f"run {self.run_id!r}" + (f" entry {self.seq}" if self.seq is not None else "")
        return f"{where}: {self.what}"


@dataclass(frozen=True, slots=True)
class Head:
    """A run's last entry: its ``seq`` and link, and the run's tenant."""

    run_id: str
    tenant: str
    seq: int
    link: bytes


@dataclass(slots=True)
class Chains:
    """What a pass over the entries found."""

    entries: int = 0
    #: entries written before the chain existed (a prefix of their run's)
    before_chain: int = 0
    #: entries whose key was destroyed (erased): linked by their stored digest, their content unreadable
    erased: int = 0
    #: entries whose body a retention policy removed: linked by their stored digest, their body gone
    expired: int = 0
    #: anchored runs deleted since, with a record that reaches their anchored entry (``check_anchor``)
    deleted: int = 0
    heads: dict[str, Head] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    #: (run, seq) -> link, for each entry an anchor's head names (``want``)
    found: dict[str, bytes] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)

    def fail(self, run_id: str, seq: int | None, what: str) -> None:
        """Record the first problem of a run (later ones follow from it)."""
        if run_id in self.broken:
            return
        self.broken.add(run_id)
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(run_id, seq, what))


def verify_chains(rows: Iterable[tuple[Any, ...]], tenants: dict[str, str], digester: Digester | None,
                  want: dict[str, int] | None = None, check_digests: bool = True,
                  legacy: dict[str, int] | None = None,
                  plain_before: Callable[[Any, str, int], bytes | None] | None = None,
                  earlier: Callable[[Any, str], bytes | None] | None = None) -> Chains:
    """Check every row (``auditsql.ENTRY_COLUMNS``, in ``(run_id, seq)``
    order). ``tenants``: run -> tenant from the run rows; ``legacy``: run ->
    its last entry written before the chain (``audit_legacy``: only those
    may have no link); ``digester``: a sealed
    entry's keyed digest (``None``: the store does not seal); ``want``: run ->
    seq whose link to keep in ``found``; ``plain_before``: the plain digest
    of an entry written before its tenant's audit key existed (``None`` for
    a later one: ``auditkeys.AuditKeys.plain_before_keys``); ``earlier``: a
    sealed entry's keyed digest of the version before ``digester``'s
    (``auditkeys.AuditKeys.earlier``: entries written before keyed BLAKE2b
    hold HMAC-SHA-256). ``check_digests=False`` checks the
    links only (no payload read back, no decryption)."""
    chains = Chains()
    wanted = want or {}
    before = legacy or {}
    broken = chains.broken
    heads = chains.heads
    run: str | None = None
    previous = GENESIS
    expected = 1
    prefix = True
    last: tuple[str, int, bytes] | None = None  # the run's head so far (tenant, seq, link)
    count = 0
    for row in rows:
        run_id, seq = row[0], int(row[1])
        count += 1
        if run_id != run:
            if last is not None and run is not None:
                heads[run] = Head(run, *last)
            run, previous, expected, prefix, last = run_id, GENESIS, 1, True, None
        stored_digest, stored_link, tenant = row[15], row[16], row[17]
        if run_id in broken:
            continue
        if seq != expected:
            chains.fail(run_id, expected, f"entries {expected} to {seq - 1} are missing (deleted)"
                        if seq > expected + 1 else f"entry {expected} is missing (deleted)")
            continue
        expected = seq + 1
        if stored_link is None:
            if prefix and seq <= before.get(run_id, 0):  # written before the chain: it starts after them
                chains.before_chain += 1
                continue
            chains.fail(run_id, seq, "the entry has no audit link (written outside Cairn, or its link was "
                                     "removed)")
            continue
        prefix = False
        if type(stored_link) is not bytes:  # PostgreSQL may read back a memoryview
            stored_link = bytes(stored_link)
        if stored_link == PENDING:
            chains.fail(run_id, seq, "the entry was never linked (written outside Cairn)")
            continue
        if tenants.get(run_id) != tenant:
            chains.fail(run_id, seq, f"the entry's tenant {tenant!r} is not its run's "
                                     f"({tenants.get(run_id)!r}): moved across tenants")
            continue
        # the formula is the one the stored link declares (32 bytes: SHA-256, 33 with 0x02: BLAKE2b,
        # with 0x03: BLAKE2b over a plain digest by BLAKE2b): each checks every byte the others do,
        # so a relabelled row is no weaker check
        version = link_version(stored_link)
        recomputed = stored_digest is None
        if recomputed:  # not stored: the plaintext beside it gives it, the link checks it
            stored_digest = recomputed_digest(row, version)
            if stored_digest is None:
                chains.fail(run_id, seq, "the entry's digest was not stored and its body cannot be read "
                                         "back to recompute it (removed or damaged)")
                continue
        else:
            if type(stored_digest) is not bytes:
                stored_digest = bytes(stored_digest)
            if check_digests and not (digester is None and _plain_matches(row, stored_digest, version)):
                problem = _digest_problem(row, tenant, digester, stored_digest, plain_before, earlier,
                                          version)
                if problem is _ERASED:
                    chains.erased += 1
                elif problem is _EXPIRED:
                    chains.expired += 1
                elif problem is not None:
                    chains.fail(run_id, seq, problem)
                    continue
        if row_link(previous, row, stored_digest, version) != stored_link:
            what = "payload or detail (its digest, not stored, recomputed from them) or its " \
                if recomputed else ""
            chains.fail(run_id, seq, "the entry does not match its link: its " + what + "metadata (type, "
                                     "time, actor, position, name...) was edited, it was moved or copied "
                                     "from elsewhere, or an entry before it was rewritten")
            continue
        previous = stored_link
        if wanted and wanted.get(run_id) == seq:
            chains.found[run_id] = stored_link
        last = (str(tenant), seq, stored_link)
    if last is not None and run is not None:
        heads[run] = Head(run, *last)
    chains.entries = count
    for run_id in broken:  # a broken run has no trustworthy head
        heads.pop(run_id, None)
    return chains


#: ``_digest_problem``'s answer for an entry whose key was destroyed
_ERASED = "erased"
#: ``_digest_problem``'s answer for an entry whose body a retention policy removed
_EXPIRED = "expired"


def _expired(row: tuple[Any, ...]) -> str | None:
    """``_EXPIRED`` for an entry whose body retention removed, the problem
    for an expired marker where no retention class puts one (a body hidden
    by hand), ``None`` for any other entry. The classes that expire bodies:
    a model call's completion, and an entry stored by reference."""
    stored = row[12]
    if stored is None or bytes(stored[:2]) != EXPIRED_TAG:
        return None
    model_call = row[2] == "step.completed" and row[7] == "model"
    if not model_call and row[13] is None:
        return ("the entry's body is marked expired, but no retention class expires the body of such an "
                "entry (neither a model call nor a body stored by reference): it was removed by hand")
    return _EXPIRED


def recomputed_digest(row: tuple[Any, ...], version: int | None = None) -> bytes | None:
    """The plain digest of an entry whose digest was not stored (a store
    without a keyring: ``sqlite._audited``), from its payload and detail as
    stored (``auditsql.ENTRY_COLUMNS``), of the formula its link's
    ``version`` covers (``None``: the version of the link stored in the
    row; 3: BLAKE2b, else SHA-256); ``None`` if they cannot give it
    (a body expired, packed bytes damaged): such an entry cannot be checked,
    which is why retention and adoption store the digest before they
    change the body (``retentionsql``, ``rekey``)."""
    if version is None:
        version = 0 if row[16] is None else link_version(bytes(row[16]))
    payload = row[12]
    try:
        if payload is not None and type(payload) is not bytes:
            payload = bytes(payload)
        detail = None if row[14] is None else _decode_json(row[14])
        if payload is not None and payload[:1] == b"\x00":
            if payload[:2] == EXPIRED_TAG:
                return None
            payload = unpack_payload(payload, f"the payload of entry {row[1]}", False)
        return digest_v3(payload, detail) if version == 3 else digest(payload, detail)
    except (DamagedRow, ValueError, TypeError, msgspec.DecodeError):
        return None


def _plain_matches(row: tuple[Any, ...], stored: bytes, version: int) -> bool:
    """Whether an unsealed entry stored as it is (no packed, spilled or
    expired payload: none starts with a NUL byte) matches its digest: the
    verifier's common case, checked without ``_digest_problem``'s calls.
    ``False`` sends the entry there, which says what is wrong (or that
    nothing is: a packed payload)."""
    payload, detail_text = row[12], row[14]
    if payload is not None:
        if type(payload) is not bytes:
            payload = bytes(payload)
        if payload[:1] == b"\x00":
            return False
    try:
        detail = None if detail_text is None else _decode_json(detail_text)
    except (msgspec.DecodeError, TypeError):
        return False
    return (digest_v3(payload, detail) if version == 3 else digest(payload, detail)) == stored


def _digest_problem(row: tuple[Any, ...], tenant: str, digester: Digester | None, stored: bytes,
                    plain_before: Callable[[Any, str, int], bytes | None] | None = None,
                    earlier: Callable[[Any, str], bytes | None] | None = None,
                    version: int = 2) -> str | None:
    """What is wrong with an entry's payload and detail against its digest
    (``None``: nothing); a plain digest is of the formula the entry's link
    ``version`` covers (``auditlinks.plain_digest``)."""
    expired = _expired(row)
    if expired is not None:
        return expired  # nothing to check its digest against: its link still is
    try:
        if digester is None:  # the stored values themselves (no entry built)
            detail = None if row[14] is None else _decode_json(row[14])
            found = plain_digest(unpack_payload(row[12], f"the payload of entry {row[1]}", False), detail,
                                 version)
        else:
            event = event_from_row(row[:15], lenient=False)
            found = digester(event, tenant)
            if found != stored and earlier is not None:  # keyed as written before the current version
                found = earlier(event, tenant) or found
            if found != stored and plain_before is not None:
                found = plain_before(event, tenant, version) or found
    except KeyGone:
        return _ERASED  # nothing to check its digest against: its link still is
    except SealError as exc:
        return f"a sealed value does not open (its ciphertext was edited, or moved): {exc}"
    except (DamagedRow, ValueError, TypeError, msgspec.DecodeError) as exc:
        return f"the entry is damaged: {exc}"
    if found != stored:
        return "the payload or detail differs from the digest recorded when it was written (edited)"
    return None


def verify_store(store: Any, *, tenant: str | None = None, run_id: str | None = None,
                 want: dict[str, int] | None = None, check_digests: bool = True,
                 progress: Callable[[int], None] | None = None) -> Chains:
    """``verify_chains`` over a SQL store's rows (``auditsql.SQLAudit``;
    ``store.audit_digest`` opens sealed entries when it is wrapped by a
    ``SealedStore``)."""
    damaged: list[tuple[str, str]] = []
    rows = store.audit_entries(tenant=tenant, run_id=run_id, damaged=damaged)
    tenants = store.audit_run_tenants(tenant=tenant, run_id=run_id)
    chains = verify_chains(rows, tenants, getattr(store, "audit_digest", None), want, check_digests,
                           store.audit_legacy(), getattr(store, "audit_plain_before", None),
                           getattr(store, "audit_earlier", None))
    # an archive that cannot be read is a run whose history cannot be shown intact: tampered
    chains.problems.extend(Problem(run, None, f"its archive cannot be read: {why}") for run, why in damaged)
    return chains


def check_anchor(chains: Chains, heads: dict[str, tuple[int, bytes]], tenant_of: dict[str, str],
                 stamp: str, deleted: dict[str, tuple[int, bytes | None]] | None = None) -> list[Problem]:
    """What differs between ``chains`` (found with ``want`` = these heads'
    seqs) and the run ``heads`` (run -> (seq, link)) an anchored checkpoint
    of ``stamp`` recorded for tenant ``tenant_of[run]``: a run gone, cut
    short, of another tenant now, or whose anchored entry is not the one
    there now (rewritten and relinked, or rolled back to a copy).
    ``deleted``: run -> (last seq, its link) of the runs deleted since
    (``retention_deleted``): a run gone with a record that reaches the
    anchored entry (the same link there) is not missing."""
    problems = []
    for run, (seq, anchored) in sorted(heads.items()):
        head = chains.heads.get(run)
        if run in chains.broken:
            continue  # its first problem is already named
        gone = (deleted or {}).get(run)
        if head is None and gone is not None and (gone[0] > seq or (gone[0] == seq and gone[1] == anchored)):
            chains.deleted += 1
            continue
        if head is None:
            problems.append(Problem(run, None, f"the run is gone: the anchor of {stamp} has it at entry "
                                               f"{seq}"))
        elif head.tenant != tenant_of.get(run, head.tenant):
            problems.append(Problem(run, seq, f"the run is now of tenant {head.tenant!r}, anchored as of "
                                              f"{tenant_of.get(run)!r}"))
        elif head.seq < seq:
            problems.append(Problem(run, head.seq + 1,
                                    f"the anchor of {stamp} has entries up to {seq}, only {head.seq} remain "
                                    f"(the tail was cut, or the database rolled back)"))
        elif chains.found.get(run) != anchored:
            problems.append(Problem(run, seq, f"the entry differs from the one anchored on {stamp} (the "
                                              f"history was rewritten and relinked, or rolled back)"))
    return problems
