"""The merge of parallel branches' trees into one (a graph super-step whose
tasks each worked in a directory of their own, ``engine.workspace``).

``merge(objects, base, branches)`` is a pure function of the base snapshot
and the branches' recorded roots, in task order: never of which branch
finished first, so any worker that recovers the run computes the same root.
A path changed (added, removed, rewritten, mode or kind changed) by one
branch takes that branch's entry; by several to the identical entry, that
entry; by several otherwise, ``WorkspaceConflict`` naming the path and the
branches. A directory changed by several is merged entry by entry, unless
one of them removed it or made it something else: then it is the conflict
(a removal of a directory under which another branch changed anything
cannot be merged). Subtrees whose id no branch changed are never read.

The trees it builds are exactly what a scan of the merged directory
computes (rows sorted by name, a directory's size 0), so the next body's
verification of the run's directory compares equal after a restore.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cairn.errors import WorkspaceConflict
from cairn.workspace.objects import DIR, TREE, Entry, encode_tree, object_id, pack
from cairn.workspace.trees import Objects


@dataclass(slots=True)
class Merged:
    """The merged root id and the trees the merge built (id -> stored bytes),
    which the store may lack: the branches stored everything else."""

    root: str
    new: dict[str, bytes] = field(default_factory=dict)


def merge(objects: Objects, base: str, branches: Sequence[tuple[str, str]]) -> Merged:
    """The root of ``base`` with every branch's changes: ``branches`` is
    ``(name, root)`` per branch in task order (the names are for the
    conflict's message only)."""
    out = Merged(base)
    changed = [(name, root) for name, root in branches if root != base]
    if changed:
        out.root = _merge_dir(objects, base, changed, b"", out)
    return out


def _merge_dir(objects: Objects, base: str | None, branches: list[tuple[str, str]], path: bytes,
               out: Merged) -> str:
    """The merged tree of one directory: ``base`` its tree id before (``None``:
    it did not exist), ``branches`` the trees of the branches that changed it."""
    if len({root for _, root in branches}) == 1:
        return branches[0][1]  # every changing branch left the identical tree
    before = {e.name: e for e in objects.tree(base)} if base is not None else {}
    after = [(name, {e.name: e for e in objects.tree(root)}) for name, root in branches]
    names = sorted(set(before).union(*(entries for _, entries in after)))
    merged: list[Entry] = []
    for entry_name in names:
        old = before.get(entry_name)
        changes = [(name, entries.get(entry_name)) for name, entries in after
                   if entries.get(entry_name) != old]
        if not changes:
            if old is not None:
                merged.append(old)
            continue
        distinct = {change for _, change in changes}
        if len(distinct) == 1:
            only = changes[0][1]
            if only is not None:
                merged.append(only)
            continue
        child = path + entry_name
        news = [change for _, change in changes]
        if all(e is not None and e.kind == DIR for e in news) and (old is None or old.kind == DIR):
            modes = {e.mode for e in news if e is not None and (old is None or e.mode != old.mode)}
            if len(modes) > 1:
                raise _conflict(child, [n for n, _ in changes])
            mode = modes.pop() if modes else (old.mode if old is not None else news[0].mode)  # type: ignore[union-attr]
            subtree = _merge_dir(objects, str(old.ref) if old is not None else None,
                                 [(n, str(e.ref)) for n, e in changes if e is not None], child + b"/", out)
            merged.append(Entry(entry_name, DIR, mode, 0, subtree))
            continue
        raise _conflict(child, [n for n, _ in changes])
    data = encode_tree(merged)
    oid = object_id(TREE, data)
    out.new[oid] = pack(TREE, data)
    return oid


def _conflict(path: bytes, names: list[str]) -> WorkspaceConflict:
    text = path.decode("utf-8", "surrogateescape")
    return WorkspaceConflict(f"workspace conflict at {text!r}: changed differently by parallel nodes "
                             f"{', '.join(repr(n) for n in names)}", path=text, nodes=tuple(names))


__all__ = ["Merged", "merge"]
