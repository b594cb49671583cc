"""Sealed artifacts: what addresses cost against the names they replaced, and a pass's rate.

    python -m bench.artifact_rotation            # SQLite, 64 KiB artifacts
    python -m bench.artifact_rotation --size 4096 --count 200

Per artifact, this process's CPU time (``time.process_time``; wall time on
a shared machine is mostly other processes' noise) of a put and a get on a
sealed store, both ways, in alternating rounds (the median of each is
given): *names*, as before addresses (sealed at ``(tenant, -, artifacts,
-, data)``, named by the SHA-256 of the sealed bytes, ``put_artifact``
checks a stored file by hashing it), and *addresses* (an HMAC of the
plaintext more, no hash of the sealed bytes on put). Then a re-encryption
pass over ``count`` artifacts after a rotation: CPU per artifact moved.
Figures only: no assertion.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cairn.security.envelope import seal, synthetic_nonce
from cairn.security.keyring import LocalKeyring
from cairn.store import open_store, with_keyring
from cairn.store.sealedartifacts import legacy_place


def legacy_put(store: Any, tenant: str, data: bytes) -> str:
    version, cipher = store.keys.writer(tenant)
    place = legacy_place(tenant)
    nonce = synthetic_nonce(store.keys.nonce_key(tenant, version), place, data)
    ref: str = store.inner.put_artifact(seal(cipher, version, place, data, nonce))
    return ref


def round_of(store: Any, put: Any, size: int, count: int) -> float:
    """CPU seconds per artifact of ``count`` puts and gets of distinct ``size``-byte contents."""
    values = [os.urandom(16) + b"x" * (size - 16) for _ in range(count)]
    start = time.process_time()
    for value in values:
        ref = put(store, "t", value)
        store.sealer.artifact_tenants[ref] = "t"
        assert store.get_artifact(ref) == value
    return (time.process_time() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store: Any = with_keyring(open_store(f"sqlite:///{Path(tmp) / 'c.db'}"),
                                  LocalKeyring({"k": os.urandom(32)}, "k"))
        ways = {"names (before)": legacy_put, "addresses": lambda s, t, d: s.artifacts.put(t, d)}
        found: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.rounds):
            for way, put in ways.items():
                found[way].append(round_of(store, put, args.size, args.count))
        print(f"put + get of one {args.size}-byte artifact, CPU, median of {args.rounds} alternating rounds "
              f"of {args.count} (load average {os.getloadavg()[0]:.1f}):")
        for way, times in found.items():
            print(f"  {way:16s} {statistics.median(times) * 1e6:9.1f} us")
        store.close()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'c.db'}"
        store = with_keyring(open_store(url), LocalKeyring({"k": os.urandom(32)}, "k"))
        from cairn.store.records import NewRun, Payload

        for i in range(args.count):
            ref = store.artifacts.put("t", os.urandom(16) + b"y" * (args.size - 16))
            store.inner.create_run(NewRun(f"r{i}", "w", "1", "t", None, Payload(ref=ref)))
        store.rotate("t")
        start = time.process_time()
        done = store.reencrypt("t", page=200)
        spent = time.process_time() - start
        print(f"re-encryption pass: {done.artifacts_moved} artifacts of {args.size} bytes moved, "
              f"{spent / max(done.artifacts_moved, 1) * 1e6:.1f} us CPU each "
              f"(load average {os.getloadavg()[0]:.1f})")
        store.close()


if __name__ == "__main__":
    main()
