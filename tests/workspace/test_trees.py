"""Workspace trees without a store: snapshot, restore, diff, and hostile objects.

The objects live in a dict here (``DictSource``); the store-backed paths are
tests/workspace/test_run_workspace.py. Every restore is checked by scanning
the result again from a fresh cache (all contents hashed), so "exact" means
the same root id: same names, kinds, permission bits, contents and targets.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from cairn.errors import UnsafeSnapshot, WorkspaceError
from cairn.workspace import TreeCache, diff, restore, snapshot, walk
from cairn.workspace.objects import (
    BLOB,
    CHUNK,
    DIR,
    FILE,
    LINK,
    TREE,
    Entry,
    encode_tree,
    object_id,
    pack,
)
from cairn.workspace.scan import RACY_NS, fs_clock
from cairn.workspace.trees import Objects


class DictSource:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fetched = 0
        self.calls = 0

    def put(self, batch: dict[str, bytes]) -> None:
        self.objects.update(batch)

    def fetch(self, oids: Collection[str]) -> dict[str, bytes]:
        self.fetched += len(oids)
        self.calls += 1
        return {o: self.objects[o] for o in oids if o in self.objects}


def fresh_root(path: Path) -> str:
    """The root id of ``path``, every file hashed (no cache)."""
    return snapshot(path, TreeCache(), None).root


def old(path: Path) -> None:
    """Backdate every file's mtime and wait for the filesystem's clock to
    pass their ctimes, so a stat cache may trust them (the racy-clean rule)."""
    latest = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.utime(full, (1_000_000_000, 1_000_000_000))
                latest = max(latest, os.stat(full).st_ctime_ns)
    settle(path, latest)


def settle(path: Path, latest: int) -> None:
    """Wait until the filesystem's clock (scan.fs_clock) is past ``latest``."""
    while True:
        now = fs_clock(os.fsencode(path))
        if now is None:  # no O_TMPFILE here: the system clock's rule
            time.sleep(RACY_NS / 1e9)
            return
        if now > latest:
            return
        time.sleep(0.001)


def build(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "secret.txt").write_text("mine")
    (root / "secret.txt").chmod(0o600)
    (root / "empty").mkdir()
    (root / "empty-file").write_bytes(b"")
    (root / "deep" / "er" / "est").mkdir(parents=True)
    (root / "binary.bin").write_bytes(bytes(range(256)) * 100)
    (root / "large.bin").write_bytes(os.urandom(CHUNK * 2 + 12345))
    (root / "exact-chunk.bin").write_bytes(b"x" * CHUNK)
    (root / "ünïcødé 文件 🐍.txt").write_text("unicode")
    (root / os.fsdecode(b"latin1-\xe9t\xe9")).write_bytes(b"not utf-8 name")
    (root / "link-to-passwd").symlink_to("/etc/passwd")
    (root / "dangling").symlink_to("../../nowhere")
    (root / "src-link").symlink_to("src")
    (root / "readonly-dir").mkdir()
    (root / "readonly-dir" / "inside.txt").write_text("ro")
    (root / "readonly-dir").chmod(0o555)


def test_snapshot_and_restore_are_exact(tmp_path: Path) -> None:
    src, dst = tmp_path / "a", tmp_path / "b"
    build(src)
    store = DictSource()
    scan = snapshot(src, TreeCache(), store.put)
    assert scan.files == 10
    assert scan.links == 3
    assert scan.dirs == 6
    done = restore(dst, scan.root, store, TreeCache())
    assert done.removed == 0
    assert fresh_root(dst) == scan.root == fresh_root(src)
    assert os.readlink(dst / "link-to-passwd") == "/etc/passwd"
    assert os.readlink(dst / "dangling") == "../../nowhere"
    assert stat.S_IMODE((dst / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dst / "secret.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((dst / "readonly-dir").stat().st_mode) == 0o555
    assert (dst / "empty").is_dir()
    assert not list((dst / "empty").iterdir())
    assert (dst / "large.bin").read_bytes() == (src / "large.bin").read_bytes()
    assert (dst / os.fsdecode(b"latin1-\xe9t\xe9")).read_bytes() == b"not utf-8 name"
    (src / "readonly-dir").chmod(0o755)  # let tmp_path be cleaned
    (dst / "readonly-dir").chmod(0o755)


def test_restore_removes_extras_fixes_modes_and_replaces_kinds(tmp_path: Path) -> None:
    src, dst = tmp_path / "a", tmp_path / "b"
    build(src)
    store = DictSource()
    root = snapshot(src, TreeCache(), store.put).root
    restore(dst, root, store, TreeCache())
    (dst / "readonly-dir").chmod(0o755)
    (dst / "extra.txt").write_text("left over")
    (dst / "extra-dir" / "x").mkdir(parents=True)
    (dst / "run.sh").chmod(0o644)
    (dst / "src" / "main.py").unlink()
    (dst / "src" / "main.py").mkdir()  # a directory where a file belongs
    (dst / "empty").rmdir()
    (dst / "empty").write_text("a file where a directory belongs")
    os.unlink(dst / "src-link")
    (dst / "src-link").write_text("a file where a symlink belongs")
    (dst / "binary.bin").write_bytes(b"edited")
    done = restore(dst, root, store, TreeCache())
    assert done.removed == 2
    assert fresh_root(dst) == root
    assert os.readlink(dst / "src-link") == "src"
    (src / "readonly-dir").chmod(0o755)
    (dst / "readonly-dir").chmod(0o755)


def test_unchanged_files_are_not_read_again_and_changes_are_seen(tmp_path: Path) -> None:
    root = tmp_path / "w"
    build(root)
    (root / "readonly-dir").chmod(0o755)
    old(root)
    store, cache = DictSource(), TreeCache()
    first = snapshot(root, cache, store.put)
    assert first.hashed > 2 * CHUNK
    again = snapshot(root, cache, store.put)
    assert (again.root, again.hashed, again.stored) == (first.root, 0, 0)  # nothing read, nothing new

    # same size, mtime set back: the ctime (which no user can set) still moved
    (root / "secret.txt").write_text("yours")
    (root / "secret.txt").write_text("MINE")
    os.utime(root / "secret.txt", (1_000_000_000, 1_000_000_000))
    changed = snapshot(root, cache, store.put)
    assert changed.root != first.root
    assert changed.hashed == 4
    assert changed.stored == 2  # the new blob and the root tree
    assert fresh_root(root) == changed.root


def test_a_file_written_just_before_a_snapshot_is_hashed_again(tmp_path: Path) -> None:
    """The racy-clean rule: a write in the same timestamp tick as the scan
    could keep the stat; such an entry is not trusted by the next scan."""
    root = tmp_path / "w"
    root.mkdir()
    (root / "f").write_text("one")
    # stamped in the scan's own tick or later (what a write during the scan's tick looks like)
    future = time.time_ns() + 3_600_000_000_000
    os.utime(root / "f", ns=(future, future))
    cache = TreeCache()
    snapshot(root, cache, None)
    assert snapshot(root, cache, None).hashed == 3
    assert snapshot(root, cache, None).hashed == 3  # every time, until its stamp is in the past


def test_a_directory_seen_unchanged_is_reused_but_any_change_in_it_is_seen(tmp_path: Path) -> None:
    """The per-directory memo: an unchanged listing is one comparison, and a
    change to any one entry (content with size and mtime kept, mode, a new
    name, a subdirectory's content) makes the directory's tree again."""
    root = tmp_path / "w"
    build(root)
    (root / "readonly-dir").chmod(0o755)
    old(root)
    store, cache = DictSource(), TreeCache()
    first = snapshot(root, cache, store.put)
    assert snapshot(root, cache, store.put).root == first.root
    st = os.stat(root / "src" / "main.py")
    (root / "src" / "main.py").write_text("print('HI')\n")  # same size
    os.utime(root / "src" / "main.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = snapshot(root, cache, store.put)
    assert changed.root != first.root
    assert changed.root == fresh_root(root)
    (root / "run.sh").chmod(0o700)
    assert snapshot(root, cache, store.put).root == fresh_root(root) != changed.root
    old(root)
    steady = snapshot(root, cache, store.put).root
    (root / "deep" / "er" / "x").write_text("")
    assert snapshot(root, cache, store.put).root == fresh_root(root) != steady


def test_large_file_changes_store_only_the_changed_chunk(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    data = bytearray(os.urandom(CHUNK * 4))
    (root / "big").write_bytes(data)
    store, cache = DictSource(), TreeCache()
    snapshot(root, cache, store.put)
    data[CHUNK * 2 + 7] ^= 0xFF
    (root / "big").write_bytes(data)
    scan = snapshot(root, cache, store.put)
    assert scan.stored == 3  # one chunk, the chunk list, the root tree
    assert scan.stored_bytes < CHUNK + 4096


def test_special_files_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    os.mkfifo(root / "pipe")
    with pytest.raises(WorkspaceError, match="'pipe' is a FIFO"):
        snapshot(root, TreeCache(), None)


def test_a_diff_reads_trees_one_fetch_per_level(tmp_path: Path) -> None:
    """A change in each of 20 directories two levels down: the diff reads
    its trees in one fetch per level (3), not one per directory (a store
    round trip each)."""
    root = tmp_path / "w"
    for i in range(20):
        (root / f"d{i}" / "sub").mkdir(parents=True)
        (root / f"d{i}" / "sub" / "f").write_text(f"one {i}")  # 20 distinct trees per level
    store, cache = DictSource(), TreeCache()
    a = snapshot(root, cache, store.put).root
    for i in range(20):
        (root / f"d{i}" / "sub" / "f").write_text(f"two {i}")
    b = snapshot(root, cache, store.put).root
    store.calls = 0
    changes = diff(Objects(store, b), a, b)
    assert sorted(c.path for c in changes) == sorted(f"d{i}/sub/f" for i in range(20))
    assert store.calls == 3


def test_diff_and_walk(tmp_path: Path) -> None:
    root = tmp_path / "w"
    build(root)
    (root / "readonly-dir").chmod(0o755)
    store, cache = DictSource(), TreeCache()
    a = snapshot(root, cache, store.put).root
    (root / "src" / "main.py").write_text("print('bye')\n")
    (root / "src" / "new.py").write_text("")
    (root / "run.sh").chmod(0o700)
    os.unlink(root / "dangling")
    (root / "deep" / "er" / "est").rmdir()
    b = snapshot(root, cache, store.put).root
    changes = {(c.path, c.change) for c in diff(Objects(store, b), a, b)}
    assert changes == {("src/main.py", "modified"), ("src/new.py", "added"), ("run.sh", "modified"),
                       ("dangling", "removed"), ("deep/er/est", "removed")}
    assert diff(Objects(store, a), a, a) == []
    listed = dict(walk(Objects(store, b), b))
    assert listed["src/new.py"].kind == FILE
    assert listed["src-link"].ref == b"src"


# -- hostile and damaged snapshots: refused before anything is written ---------------------


def _hostile(store: DictSource, entries: list[list[object]]) -> str:
    """A tree object built by hand (what a hostile writer of the store could put)."""
    import msgspec

    data = msgspec.msgpack.encode(entries)
    oid = object_id(TREE, data)
    store.objects[oid] = pack(TREE, data)
    return oid


#: an absolute name is given as a file of the test's own (``ABSOLUTE``), never a system file: a restore
#: that wrongly followed it must damage nothing outside the test (run as root, it once wrote /etc/passwd)
ABSOLUTE = b"<absolute victim>"


@pytest.mark.parametrize("name", [b"../escape", ABSOLUTE, b"a/b", b"..", b".", b"", b"nul\0byte",
                                  b"x" * 256])
def test_hostile_names_are_refused(tmp_path: Path, name: bytes) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    if name == ABSOLUTE:
        name = os.fsencode(victim)
    store = DictSource()
    blob = object_id(BLOB, b"pwned")
    store.objects[blob] = pack(BLOB, b"pwned")
    root = _hostile(store, [[b"a-first", FILE, 0o644, 5, blob], [name, FILE, 0o644, 5, blob]]
                    if name > b"a-first" else [[name, FILE, 0o644, 5, blob]])
    dst = tmp_path / "dst"
    with pytest.raises(UnsafeSnapshot):
        restore(dst, root, store, TreeCache())
    assert not dst.exists()  # nothing created, not even the directory
    assert not (tmp_path / "escape").exists()
    assert victim.read_bytes() == b"victim"


@pytest.mark.parametrize("entry", [
    [b"f", "x", 0o644, 0, "00" * 32],  # unknown kind
    [b"f", FILE, 0o4755, 0, "00" * 32],  # setuid bits
    [b"f", FILE, 0o644, -1, "00" * 32],
    [b"f", FILE, 0o644, 0, "../../etc/passwd"],  # not an object id
    [b"f", FILE, 0o644, 0, "/" + "0" * 63],  # an id's length, not an id
    [b"f", FILE, True, 0, "00" * 32],  # a bool for a mode
    [b"f", FILE, 0o644, 0, b"0" * 64],  # bytes where an id belongs
    [b"l", LINK, 0o777, 0, b""],
    [b"l", LINK, 0o777, 0, b"a\0b"],
])
def test_malformed_entries_are_refused(tmp_path: Path, entry: list[object]) -> None:
    store = DictSource()
    with pytest.raises(UnsafeSnapshot):
        restore(tmp_path / "dst", _hostile(store, [entry]), store, TreeCache())


def test_unsorted_or_duplicate_entries_are_refused(tmp_path: Path) -> None:
    store = DictSource()
    blob = object_id(BLOB, b"")
    store.objects[blob] = pack(BLOB, b"")
    dup = _hostile(store, [[b"a", FILE, 0o644, 0, blob], [b"a", DIR, 0o755, 0, blob]])
    with pytest.raises(UnsafeSnapshot, match="sorted and unique"):
        restore(tmp_path / "dst", dup, store, TreeCache())


def test_damaged_and_substituted_objects_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    (root / "f").write_text("the real content")
    store = DictSource()
    snap = snapshot(root, TreeCache(), store.put).root
    blob = object_id(BLOB, b"the real content")
    store.objects[blob] = pack(BLOB, b"something else!")  # another object's bytes under this id
    with pytest.raises(UnsafeSnapshot, match="damaged"):
        restore(tmp_path / "dst", snap, store, TreeCache())
    store.objects[blob] = b"z" + b"\x28\xb5\x2f\xfd garbage"
    with pytest.raises(UnsafeSnapshot):
        restore(tmp_path / "dst2", snap, store, TreeCache())
    del store.objects[blob]
    with pytest.raises(WorkspaceError, match="incomplete"):
        restore(tmp_path / "dst3", snap, store, TreeCache())


def test_a_compression_bomb_is_refused_unallocated(tmp_path: Path) -> None:
    import zstandard

    bomb = b"z" + zstandard.ZstdCompressor().compress(b"b" + b"\0" * (65 << 20))
    store = DictSource()
    fake = object_id(BLOB, b"\0" * 10)
    store.objects[fake] = bomb
    entries = [Entry(b"f", FILE, 0o644, 10, fake)]
    data = encode_tree(entries)
    root = object_id(TREE, data)
    store.objects[root] = pack(TREE, data)
    with pytest.raises(UnsafeSnapshot, match="inflates beyond"):
        restore(tmp_path / "dst", root, store, TreeCache())


def test_restore_never_writes_through_symlinks_on_disk(tmp_path: Path) -> None:
    """A step left symlinks where the snapshot has a file and a directory:
    the restore replaces the links; their targets are untouched."""
    victim_dir, victim = tmp_path / "victim-dir", tmp_path / "victim.txt"
    victim_dir.mkdir()
    victim.write_text("precious")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "planted.txt").write_text("planted")
    (src / "f.txt").write_text("overwrite?")
    store = DictSource()
    root = snapshot(src, TreeCache(), store.put).root
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "d").symlink_to(victim_dir)
    (dst / "f.txt").symlink_to(victim)
    restore(dst, root, store, TreeCache())
    assert victim.read_text() == "precious"
    assert not list(victim_dir.iterdir())
    assert not (dst / "d").is_symlink()
    assert (dst / "d" / "planted.txt").read_text() == "planted"
    assert fresh_root(dst) == root


def test_restore_never_writes_into_a_hard_link_to_a_file_elsewhere(tmp_path: Path) -> None:
    """A step hard-linked a file of the snapshot to a file outside the
    workspace (the test's own, standing for a host file): a warm restore
    that rewrites the name leaves the other file's bytes alone."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("snapshot")
    store, cache = DictSource(), TreeCache()
    root = snapshot(ws, cache, store.put).root
    (ws / "f.txt").unlink()
    os.link(victim, ws / "f.txt")
    assert snapshot(ws, cache, None).root != root
    restore(ws, root, store, cache, trust_cache=True)
    assert victim.read_text() == "precious"
    assert (ws / "f.txt").read_text() == "snapshot"
    assert os.stat(victim).st_nlink == 1


def test_a_symlink_in_a_snapshot_is_restored_as_a_symlink_and_never_followed(tmp_path: Path) -> None:
    """A snapshot with ``etc -> /etc`` and a file under ``etc/``: a tree
    cannot say that (``etc`` is one entry: a link or a directory, never
    both), and a symlink to /etc/passwd is written as a link."""
    # the victims are the test's own files, never the host's (/etc/passwd was once overwritten by a
    # restore that followed a name): a directory standing for /etc, and a file in it for /etc/passwd
    etc = tmp_path / "etc"
    etc.mkdir()
    passwd = etc / "passwd"
    passwd.write_bytes(b"root:x:0:0::/root:/bin/sh\n")
    before = passwd.read_bytes()
    store = DictSource()
    blob = object_id(BLOB, b"root::0:0::/:/bin/sh\n")
    store.objects[blob] = pack(BLOB, b"root::0:0::/:/bin/sh\n")
    sub = _hostile(store, [[b"passwd", FILE, 0o644, 21, blob]])
    target = os.fsencode(etc)
    both = _hostile(store, [[b"etc", DIR, 0o755, 0, sub], [b"etc", LINK, 0o777, len(target), target]])
    with pytest.raises(UnsafeSnapshot):
        restore(tmp_path / "dst", both, store, TreeCache())
    target = os.fsencode(passwd)
    link = _hostile(store, [[b"passwd", LINK, 0o777, len(target), target]])
    restore(tmp_path / "dst", link, store, TreeCache())
    assert os.readlink(tmp_path / "dst" / "passwd") == str(passwd)
    assert passwd.read_bytes() == before


def test_a_warm_restore_visits_only_what_differs_and_stays_exact(tmp_path: Path) -> None:
    """``trust_cache`` (the engine's warm path, right after a verifying scan):
    unchanged subdirectories are skipped, and the result, and the cache it
    leaves, are exact whichever way it goes."""
    root = tmp_path / "w"
    for d in ("same", "changed", "gone"):
        (root / d / "sub").mkdir(parents=True)
        (root / d / "sub" / "f.txt").write_text(d)
        (root / d / "g.txt").write_text(d)
    old(root)
    store, cache = DictSource(), TreeCache()
    a = snapshot(root, cache, store.put).root
    (root / "changed" / "sub" / "f.txt").write_text("new content")
    import shutil

    shutil.rmtree(root / "gone")
    (root / "added" / "x").mkdir(parents=True)
    (root / "changed").chmod(0o700)
    b = snapshot(root, cache, store.put).root
    for target, other in ((a, b), (b, a), (a, b)):
        assert snapshot(root, cache, None).root == other  # the engine's verification first
        restore(root, target, store, cache, trust_cache=True)
        assert fresh_root(root) == target
        assert snapshot(root, cache, None).root == target  # the cache it left agrees with the disk
    cold = tmp_path / "cold"
    restore(cold, a, store, TreeCache())
    assert fresh_root(cold) == a
