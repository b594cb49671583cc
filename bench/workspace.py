"""Workspace snapshots (issue 27): a 10,000-file / 100 MB tree, 10 files
changed per step, side by side with tar+zstd of the same tree in the same run.

    python -m bench.workspace            # full run (1,000 steps for the storage figure)
    python -m bench.workspace --quick    # 1,000 files / 10 MB, 50 steps

Everything goes through the real path: a SQLite store (a file in the temp
dir, ``$CAIRN_BENCH_TMPDIR`` if set), a run claimed by this process, each
snapshot's new objects stored by the fenced holder write
(``put_workspace_objects``) in the store's default durability. What one
sample is:

* ``snapshot, 10 changed``: rewrite 10 random files (same size, new bytes),
  then time ``snapshot`` (walk, hash what the stat cache cannot vouch for,
  compress and store new objects). A file changed in the same tick of the
  filesystem's clock as the scan that hashed it is hashed again by the next
  (the stat cache's racy-clean rule, ``scan.fs_clock``).
* ``snapshot, no change``: the same right after, with nothing changed.
* ``verify``: a warm worker's check before a body (``snapshot`` without a
  sink: ids only, nothing stored).
* ``restore warm``: the directory holds snapshot N, restore N-1 (10 files
  differ), with that directory's cache; then back to N.
* ``restore cold``: an empty directory and cache, the latest snapshot.
* ``diff``: the changes between two consecutive snapshots, trees read from
  the store.
* ``tar+zstd``: ``tarfile`` into a zstd stream (level 3) of the same tree;
  ``untar``: that archive extracted into a new directory (what a cold
  restore does instead).
* ``plain copy``: ``shutil.copytree`` of the tree (symlinks as symlinks),
  the least a copy-based snapshot or restore costs.
* ``stat walk``: ``scandir`` and ``lstat`` of every entry, nothing else: the
  floor of any scan that must notice a change to any file (the machine's
  speed and load in one figure: the scans are compared with it; sampled
  between the snapshot and restore samples, so at the same load).

The summary prints each target beside these baselines, all from this run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import stat
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import zstandard

import cairn
from cairn.security.keyring import LocalKeyring
from cairn.workspace import Objects, TreeCache, diff, restore, snapshot

WORDS = [f"w{i:x}" for i in range(4096)]


def build_tree(root: Path, files: int, total: int, rng: random.Random) -> list[Path]:
    """``files`` files in directories of 100, ``total`` bytes in all, text-like."""
    pool = " ".join(rng.choice(WORDS) for _ in range(400_000)).encode()
    per = total // files
    paths: list[Path] = []
    for i in range(files):
        d = root / f"pkg{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        size = max(1, int(per * rng.uniform(0.5, 1.5)))
        start = rng.randrange(0, len(pool) - size)
        p = d / f"module_{i:05d}.py"
        p.write_bytes(pool[start:start + size])
        paths.append(p)
    old = time.time() - 3600  # written an hour ago: the stat cache may trust them
    for p in paths:
        os.utime(p, (old, old))
    return paths


def change(paths: list[Path], n: int, rng: random.Random) -> None:
    for p in rng.sample(paths, n):
        size = p.stat().st_size
        p.write_bytes((" ".join(rng.choice(WORDS) for _ in range(size // 4 + 1)).encode())[:size])


def tar_zstd(root: Path) -> tuple[float, bytes]:
    out = io.BytesIO()
    t0 = time.perf_counter()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as z, \
            tarfile.open(fileobj=z, mode="w|") as tar:
        tar.add(str(root), arcname=".")
    return time.perf_counter() - t0, out.getvalue()


def untar_zstd(data: bytes, dest: Path) -> float:
    """Extract a tar+zstd snapshot into a new directory (the cold restore's counterpart)."""
    t0 = time.perf_counter()
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as z, \
            tarfile.open(fileobj=z, mode="r|") as tar:
        tar.extractall(dest, filter="tar")
    return time.perf_counter() - t0


class Source:
    def __init__(self, app: cairn.App) -> None:
        self.app = app

    def fetch(self, oids: Collection[str]) -> dict[str, bytes]:
        return self.app.store.workspace_objects("default", oids)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def med_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def stat_walk(path: bytes) -> int:
    """``lstat`` every entry below ``path`` (the floor of a change-noticing scan)."""
    n = 0
    with os.scandir(path) as found:
        items = list(found)
    for item in items:
        st = item.stat(follow_symlinks=False)
        n += 1
        if stat.S_ISDIR(st.st_mode):
            n += stat_walk(item.path)
    return n


def summary(f: dict[str, Any]) -> None:
    """Each target beside the baselines of the same run (times in ms)."""
    tar, copy, walk = f["tar_zstd_median_s"] * 1000, f["plain_copy_median_s"] * 1000, f["stat_walk_median_ms"]
    rows = [
        ("snapshot, 10 changed", f["snapshot_10_changed_median_ms"], 50, tar),
        ("snapshot, no change", f["snapshot_no_change_median_ms"], 40, tar),
        ("verify (warm worker)", f["verify_median_ms"], 40, tar),
        ("restore, warm", f["restore_warm_median_ms"], 50, f["untar_zstd_median_s"] * 1000),
        ("restore, cold", f["restore_cold_median_s"] * 1000, 2000, f["untar_zstd_median_s"] * 1000),
        ("diff", f["diff_median_ms"], 20, None),
    ]
    print(f"\n{'':22} {'median ms':>10} {'target':>7} {'x stat walk':>12} {'tar/untar ms':>13} "
          f"{'copy ms':>8}")
    for name, value, target, tar_like in rows:
        print(f"{name:22} {value:10.1f} {target:7} {value / walk:12.2f} "
              f"{'' if tar_like is None else f'{tar_like:.0f}':>13} {copy:8.0f}")
    print(f"(stat walk of the tree: {walk:.1f} ms; tar+zstd {tar:.0f} ms, {f['tar_zstd_mb']} MB; stored per "
          f"10-file snapshot {f['stored_per_snapshot_median_kb']} KB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="snapshots with 10 changed files")
    parser.add_argument("--out", default="bench/results/workspace.json")
    parser.add_argument("--sealed", action="store_true",
                        help="with a keyring: objects sealed at keyed addresses (store/wssealed.py)")
    args = parser.parse_args(argv)
    files, total = (1_000, 10 << 20) if args.quick else (10_000, 100 << 20)
    steps = args.steps or (50 if args.quick else 1_000)
    rng = random.Random(27)
    base = Path(tempfile.mkdtemp(prefix="cairn-bench-ws-", dir=os.environ.get("CAIRN_BENCH_TMPDIR")))
    ws = base / "ws"
    t0 = time.perf_counter()
    paths = build_tree(ws, files, total, rng)
    print(f"tree: {files} files, {sum(p.stat().st_size for p in paths) / 1e6:.1f} MB in {ws} "
          f"(built in {time.perf_counter() - t0:.1f} s)")

    db = base / "bench.db"
    ring = LocalKeyring({"bench": os.urandom(32)}, "bench") if args.sealed else None
    app = cairn.App(db=f"sqlite:///{db}", keyring=ring)

    @app.workflow(name="bench-ws")
    def held(ctx: cairn.Context) -> None:
        return None

    app.start(held, run_id="b1")
    claim = app.store.claim_run("b1", "bench", lease_seconds=86_400, max_recoveries=5)
    assert claim is not None
    epoch = claim.run.epoch

    def sink(batch: dict[str, bytes]) -> None:
        app.store.put_workspace_objects("b1", epoch, batch)

    cache = TreeCache()
    first_s, first = timed(lambda: snapshot(ws, cache, sink))
    print(f"first snapshot: {first_s:.2f} s, {first.stored} objects, "
          f"{first.stored_bytes / 1e6:.1f} MB stored")

    roots = [first.root]
    snap_s: list[float] = []
    stored_b: list[int] = []
    stored_n: list[int] = []
    none_s: list[float] = []
    none_stored: list[int] = []
    verify_s: list[float] = []
    walk_s: list[float] = []
    for i in range(steps):
        change(paths, 10, rng)
        s, scan = timed(lambda: snapshot(ws, cache, sink))
        snap_s.append(s)
        stored_b.append(scan.stored_bytes)
        stored_n.append(scan.stored)
        roots.append(scan.root)
        if i < 50:
            s, same = timed(lambda: snapshot(ws, cache, sink))
            none_s.append(s)
            none_stored.append(same.stored)
            assert same.root == scan.root
            s, _ = timed(lambda: snapshot(ws, cache, None))
            verify_s.append(s)
            walk_s.append(timed(lambda: stat_walk(os.fsencode(ws)))[0])  # beside them, at the same load

    warm_s: list[float] = []
    for _ in range(10):
        # a warm worker's restore (engine.workspace): verify by a scan, then restore what differs
        s, _ = timed(lambda: (snapshot(ws, cache, None),
                              restore(ws, roots[-2], Source(app), cache, trust_cache=True)))
        warm_s.append(s)
        s, _ = timed(lambda: (snapshot(ws, cache, None),
                              restore(ws, roots[-1], Source(app), cache, trust_cache=True)))
        warm_s.append(s)
        walk_s.append(timed(lambda: stat_walk(os.fsencode(ws)))[0])

    cold_s: list[float] = []
    for k in range(3):
        s, _ = timed(lambda k=k: restore(base / f"cold{k}", roots[-1], Source(app), TreeCache()))  # type: ignore[misc]
        cold_s.append(s)
    assert snapshot(base / "cold0", TreeCache(), None).root == roots[-1]

    diff_s: list[float] = []
    changed: list[int] = []
    for k in range(1, min(len(roots), 21)):
        s, found = timed(lambda k=k: diff(Objects(Source(app), roots[-k]), roots[-k - 1], roots[-k]))  # type: ignore[misc]
        diff_s.append(s)
        changed.append(len(found))

    copy_s: list[float] = []
    for k in range(3):
        s, _ = timed(lambda k=k: shutil.copytree(ws, base / f"copy{k}", symlinks=True))  # type: ignore[misc]
        copy_s.append(s)

    tar_s: list[float] = []
    untar_s: list[float] = []
    tar_b = b""
    for k in range(3):
        s, tar_b = tar_zstd(ws)
        tar_s.append(s)
        untar_s.append(untar_zstd(tar_b, base / f"untar{k}"))
    app.close()

    figures = {
        "sealed": args.sealed, "files": files, "bytes": sum(p.stat().st_size for p in paths), "steps": steps,
        "first_snapshot_s": round(first_s, 3), "first_snapshot_stored_mb": round(first.stored_bytes / 1e6, 2),
        "snapshot_10_changed_median_ms": med_ms(snap_s),
        "snapshot_10_changed_p90_ms": round(sorted(snap_s)[int(len(snap_s) * 0.9)] * 1000, 2),
        "stored_per_snapshot_median_kb": round(statistics.median(stored_b) / 1000, 1),
        "objects_per_snapshot_median": statistics.median(stored_n),
        "stored_total_mb_all_steps": round((first.stored_bytes + sum(stored_b)) / 1e6, 1),
        "db_file_mb": round(db.stat().st_size / 1e6, 1),
        "snapshot_no_change_median_ms": med_ms(none_s),
        "snapshot_no_change_objects_max": max(none_stored),
        "verify_median_ms": med_ms(verify_s),
        "restore_warm_median_ms": med_ms(warm_s),
        "restore_cold_median_s": round(statistics.median(cold_s), 3),
        "diff_median_ms": med_ms(diff_s), "diff_changes_median": statistics.median(changed),
        "tar_zstd_median_s": round(statistics.median(tar_s), 3), "tar_zstd_mb": round(len(tar_b) / 1e6, 1),
        "untar_zstd_median_s": round(statistics.median(untar_s), 3),
        "plain_copy_median_s": round(statistics.median(copy_s), 3),
        "stat_walk_median_ms": med_ms(walk_s),
    }
    print(json.dumps(figures, indent=2))
    summary(figures)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
                                              "figures": figures, "samples": {
                                                  "snapshot_10_changed_s": snap_s, "no_change_s": none_s,
                                                  "restore_warm_s": warm_s, "restore_cold_s": cold_s,
                                                  "diff_s": diff_s, "tar_zstd_s": tar_s,
                                                  "untar_zstd_s": untar_s, "plain_copy_s": copy_s,
                                                  "stat_walk_s": walk_s}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
