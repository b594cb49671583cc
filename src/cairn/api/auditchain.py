"""Verifying the audit chain (issue 26): the per-run hash chains the
database writes (``store.auditlinks``), checked against a signed checkpoint
of a tenant's run heads exported to an anchor outside the database
(``api.auditanchor``).

A chain alone proves the order and content of a run's entries relative to
one another, but the hash is keyless: whoever can write the database can
rewrite a run's entries *and* relink them from that point on, or drop its
last entries. Only a head recorded outside the database catches that, so
the verdict is one of three, never a plain pass:

- ``TAMPERED``: a link does not match its entry, an entry or link is
  missing, or a run's entry differs from (or no longer reaches) the head
  its anchor recorded. The first bad entry is named, with what is wrong.
- ``UNANCHORED``: every chain holds together, but some entries (or all,
  with no anchor) are newer than the last exported checkpoint: they are
  verified only as a chain, up to that checkpoint.
- ``VERIFIED``: every chain holds and every entry is covered by the anchor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cairn.store.auditlinks import GENESIS, canonical

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
    """A run's last link: its ``seq`` and the link there."""

    run_id: str
    tenant: str
    seq: int
    link: bytes


@dataclass(slots=True)
class Chains:
    """What a pass over the entries and links found."""

    entries: int = 0
    heads: dict[str, Head] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    #: the link at each ``(run_id, seq)`` asked for (an anchor's heads)
    found: dict[str, bytes] = field(default_factory=dict)
    #: runs with a problem: their later entries are not judged again
    broken: set[str] = field(default_factory=set)

    def fail(self, run_id: str, seq: int | None, what: str) -> None:
        if run_id in self.broken:
            return
        self.broken.add(run_id)
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(run_id, seq, what))


def verify_chains(entries: Iterable[tuple[Any, ...]], links: Iterable[tuple[Any, ...]],
                  has_links: Callable[[str], bool], want: dict[str, int] | None = None) -> Chains:
    """Check every entry against its link, in one merge of the two streams
    (each in ``(run_id, seq)`` order as the database sorts run ids:
    ``Store.audit_entries`` and ``Store.audit_links``). Each link is
    recomputed from the *stored* link before it, so the first bad entry of a
    run is the one named; a run's entries must start at 1 and follow each
    other. Run ids are only ever compared for equality (the database's
    collation orders them, not Python's): where the two streams are at
    different runs, ``has_links(run_id)`` says whether the entries' run has
    any link at all, which tells which stream is at a run the other lacks.
    ``want``: run -> seq whose link to keep in ``found`` (an anchor's heads)."""
    chains = Chains()
    wanted = want or {}
    sha256 = hashlib.sha256
    entry_iter, link_iter = iter(entries), iter(links)
    entry = next(entry_iter, None)
    link = next(link_iter, None)
    run: str | None = None
    previous = GENESIS
    last_seq = 0
    while entry is not None or link is not None:
        if link is None or (entry is not None and entry[0] != link[0] and not has_links(entry[0])):
            assert entry is not None  # an entry of a run without any link
            chains.fail(entry[0], int(entry[1]), "the entry has no audit link (written outside Cairn, or its "
                                                 "link was deleted)")
            entry = next(entry_iter, None)
            continue
        if entry is None or entry[0] != link[0] or int(link[1]) < int(entry[1]):
            chains.fail(link[0], int(link[1]), "the entry is missing (deleted; its audit link remains)")
            link = next(link_iter, None)
            continue
        run_id, seq = entry[0], int(entry[1])
        if run_id != run:
            run, previous, last_seq = run_id, GENESIS, 0
        if int(link[1]) > seq:
            chains.fail(run_id, seq, "the entry has no audit link (written outside Cairn, or its link was "
                                     "deleted)")
            entry = next(entry_iter, None)
            continue
        chains.entries += 1
        tenant = entry[2]
        stored_link = bytes(link[3])
        if seq != last_seq + 1:
            chains.fail(run_id, seq, f"entries {last_seq + 1} to {seq - 1} are missing")
        elif link[2] != tenant:
            chains.fail(run_id, seq, f"the entry's tenant {tenant!r} is not its link's ({link[2]!r})")
        elif sha256(previous + canonical(entry)).digest() != stored_link:
            chains.fail(run_id, seq, "the stored entry does not match its audit link (the entry was edited, "
                                     "moved, or a link before it was rewritten)")
        if wanted.get(run_id) == seq:
            chains.found[run_id] = stored_link
        chains.heads[run_id] = Head(run_id, str(tenant), seq, stored_link)
        previous, last_seq = stored_link, seq
        entry = next(entry_iter, None)
        link = next(link_iter, None)
    return chains


# -- the Merkle root of a tenant's run heads --------------------------------------------------


def leaf_hash(run_id: str, seq: int, link: bytes) -> bytes:
    """A head's leaf: domain-separated from inner nodes (RFC 6962's 0x00/0x01)."""
    return hashlib.sha256(b"\x00" + canonical((run_id, seq, link))).digest()


def merkle_root(leaves: list[bytes]) -> bytes:
    """The root over ``leaves`` (already hashed, in run id order), split at
    the largest power of two below the count as RFC 6962 does."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    split = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + merkle_root(leaves[:split]) + merkle_root(leaves[split:])).digest()


def heads_root(heads: dict[str, tuple[int, bytes]]) -> bytes:
    """The Merkle root of run heads ``run_id -> (seq, link)``."""
    return merkle_root([leaf_hash(run_id, seq, link) for run_id, (seq, link) in sorted(heads.items())])
