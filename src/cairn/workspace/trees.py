"""Reading stored trees: loading them from a store, listing and diffing.

A ``Source`` answers ``fetch(ids)`` with the stored bytes of those it
holds (a store's ``workspace_objects`` for one tenant). Every object read
through ``Objects`` is checked (``objects.unpack``, ``decode_tree``): a
damaged or hostile object is ``UnsafeSnapshot`` before anything uses it,
and a missing one is ``WorkspaceError`` naming the snapshot.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Protocol

from cairn.errors import UnsafeSnapshot, WorkspaceError
from cairn.workspace.objects import (
    BLOB,
    CHUNKS,
    DIR,
    TREE,
    Entry,
    decode_tree,
    split_chunks,
    unpack,
)

#: ids per fetch (one statement each)
FETCH_BATCH = 512


class Source(Protocol):
    def fetch(self, oids: Collection[str]) -> dict[str, bytes]:
        """The stored bytes of those of ``oids`` that are stored."""
        ...


class Objects:
    """Checked reads of one tenant's objects, trees cached by id."""

    def __init__(self, source: Source, root: str) -> None:
        self.source = source
        self.root = root
        self.trees: dict[str, list[Entry]] = {}

    def fetch(self, oids: Collection[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(oids))
        found: dict[str, bytes] = {}
        for i in range(0, len(wanted), FETCH_BATCH):
            found.update(self.source.fetch(wanted[i:i + FETCH_BATCH]))
        missing = [o for o in wanted if o not in found]
        if missing:
            raise WorkspaceError(f"workspace snapshot {self.root} is incomplete: object {missing[0]} is not "
                                 f"stored ({len(missing)} missing)")
        return found

    def load(self, kind: bytes, oid: str, stored: bytes) -> bytes:
        found, data = unpack(oid, stored)
        if found != kind:
            raise UnsafeSnapshot(f"workspace object {oid} is a {found!r} object where a {kind!r} one belongs")
        return data

    def load_all(self, skip: Collection[str] = ()) -> dict[str, list[Entry]]:
        """Every tree of the snapshot, one fetch per level of depth, except
        the subtrees ``skip`` names (trees already on disk: ``tree`` reads
        one of them if it is wanted after all)."""
        level = [self.root]
        while level:
            wanted = [o for o in dict.fromkeys(level) if o not in self.trees and o not in skip]
            stored = self.fetch(wanted)
            level = []
            for oid in wanted:
                entries = decode_tree(oid, self.load(TREE, oid, stored[oid]))
                self.trees[oid] = entries
                level.extend(str(e.ref) for e in entries if e.kind == DIR)
        return self.trees

    def load_trees(self, oids: Collection[str]) -> None:
        """Read the trees ``oids`` not read yet, in one fetch per batch."""
        wanted = [o for o in dict.fromkeys(oids) if o not in self.trees]
        if wanted:
            stored = self.fetch(wanted)
            for oid in wanted:
                self.trees[oid] = decode_tree(oid, self.load(TREE, oid, stored[oid]))

    def tree(self, oid: str) -> list[Entry]:
        if oid not in self.trees:
            self.trees[oid] = decode_tree(oid, self.load(TREE, oid, self.fetch([oid])[oid]))
        return self.trees[oid]

    def content(self, entry: Entry, stored: dict[str, bytes]) -> Iterator[bytes]:
        """A file's bytes, chunk by chunk, from ``stored`` (fetched when absent)."""
        oid = str(entry.ref)
        got = stored.get(oid) or self.fetch([oid])[oid]
        kind, data = unpack(oid, got)
        if kind == BLOB:
            blobs = [(oid, data)]
        elif kind == CHUNKS:
            parts = split_chunks(oid, data)
            missing = [p for p in parts if p not in stored]
            more = self.fetch(missing) if missing else {}
            blobs = [(p, self.load(BLOB, p, stored.get(p) or more[p])) for p in parts]
        else:
            raise UnsafeSnapshot(f"workspace file {entry.text!r} names {oid}, which is not a file's content")
        size = 0
        for _, blob in blobs:
            size += len(blob)
            yield blob
        if size != entry.size:
            raise UnsafeSnapshot(f"workspace file {entry.text!r}: its content is {size} bytes, its entry "
                                 f"says {entry.size}")


def walk(objects: Objects, oid: str, prefix: str = "") -> Iterator[tuple[str, Entry]]:
    """Every entry below tree ``oid`` as ``(path, entry)``, depth first, sorted."""
    for entry in objects.tree(oid):
        path = f"{prefix}{entry.text}"
        yield path, entry
        if entry.kind == DIR:
            yield from walk(objects, str(entry.ref), path + "/")


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between two snapshots: ``added``, ``removed`` or
    ``modified`` (content, mode, kind or symlink target)."""

    path: str
    change: str
    old: Entry | None
    new: Entry | None

    def as_dict(self) -> dict[str, object]:
        def side(e: Entry | None) -> dict[str, object] | None:
            if e is None:
                return None
            ref = e.ref.decode("utf-8", "surrogateescape") if isinstance(e.ref, bytes) else e.ref
            return {"kind": {"f": "file", "d": "dir", "l": "symlink"}[e.kind], "mode": oct(e.mode),
                    "size": e.size, ("target" if e.kind == "l" else "id"): ref}
        return {"path": self.path, "change": self.change, "old": side(self.old), "new": side(self.new)}


def diff(objects: Objects, old: str | None, new: str) -> list[Change]:
    """What changed from tree ``old`` (``None``: empty) to tree ``new``;
    subtrees with the same id are skipped unread. A directory added or
    removed is listed with everything under it."""
    _preload(objects, old, new)
    changes: list[Change] = []
    _diff(objects, old, new, "", changes)
    return changes


def _preload(objects: Objects, old: str | None, new: str) -> None:
    """Read every tree ``_diff`` will visit, one fetch per level of depth
    (not one per directory: a store round trip each)."""
    pairs: list[tuple[str | None, str | None]] = [(old, new)]
    while pairs:
        objects.load_trees([o for pair in pairs for o in pair if o is not None])
        deeper: list[tuple[str | None, str | None]] = []
        for a, b in pairs:
            if a == b:
                continue
            before = {e.name: e for e in objects.tree(a)} if a is not None else {}
            after = {e.name: e for e in objects.tree(b)} if b is not None else {}
            for name in before.keys() | after.keys():
                x, y = before.get(name), after.get(name)
                xd = str(x.ref) if x is not None and x.kind == DIR else None
                yd = str(y.ref) if y is not None and y.kind == DIR else None
                if xd != yd:
                    deeper.append((xd, yd))
        pairs = deeper


def _diff(objects: Objects, old: str | None, new: str | None, prefix: str, out: list[Change]) -> None:
    if old == new:
        return
    before = {e.name: e for e in objects.tree(old)} if old is not None else {}
    after = {e.name: e for e in objects.tree(new)} if new is not None else {}
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        path = prefix + (a or b).text  # type: ignore[union-attr]
        if a is not None and b is not None and a == b:
            continue
        if a is not None and b is not None and a.kind == b.kind == DIR:
            if a.mode != b.mode:
                out.append(Change(path, "modified", a, b))
            _diff(objects, str(a.ref), str(b.ref), path + "/", out)
            continue
        if a is not None and b is not None:
            out.append(Change(path, "modified", a, b))
            if a.kind == DIR:
                _diff(objects, str(a.ref), None, path + "/", out)
            if b.kind == DIR:
                _diff(objects, None, str(b.ref), path + "/", out)
            continue
        out.append(Change(path, "added" if a is None else "removed", a, b))
        entry = a or b
        assert entry is not None
        if entry.kind == DIR:
            _diff(objects, str(a.ref) if a else None, str(b.ref) if b else None, path + "/", out)


__all__ = ["Change", "Objects", "Source", "diff", "walk"]
