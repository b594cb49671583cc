"""The randomized tamper test of issue 26: 10,000 trials per backend (5,000
sealed, 5,000 not), each one edit of the stored history made behind the
store's back, every one detected by the verifier.

The database is built once per backend and mode by real runs; its rows are
read as the verifier reads them (``Store.audit_entries``) and a signed-off
checkpoint of its run heads is taken (what an anchor holds). Each trial
tampers with a copy of those rows and runs the verifier over the runs it
changed (chains are per run), then compares their heads with the
checkpoint's. A sample of the trials is also
written back into the database and verified from there, to show that the
in-memory rows stand for the stored ones. Kinds: edit (any column), delete,
insert, reorder, truncate the tail, roll back (a run, or the whole database,
to a backup copy), splice an entry from another run, forge the actor, and
an attacker who edits and then recomputes every link after the edit.

What is by design not detectable, and so not a trial: cutting entries
newer than the last anchored checkpoint (``cairn audit verify`` says
UNANCHORED for those, never VERIFIED).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import cairn
from cairn.store import oplog
from cairn.store.admission import QueueLimits, QueueShare
from cairn.store.auditlinks import GENESIS, digest, link
from cairn.store.auditsql import ENTRY_COLUMNS
from cairn.store.auditverify import (
    Chains,
    Problem,
    check_anchor,
    recomputed_digest,
    verify_chains,
    verify_store,
)
from tests.audit.test_chain import made
from tests.encryption.test_sealed_store import Raw, drive

Row = tuple[Any, ...]
TRIALS = 5000
WRITTEN_BACK = 12
KINDS = ("edit", "delete", "insert", "reorder", "truncate", "rollback", "splice", "forge_actor", "relink")
COL = {name: i for i, name in enumerate(ENTRY_COLUMNS)}


def by_run(rows: list[Row]) -> dict[str, list[Row]]:
    runs: dict[str, list[Row]] = {}
    for row in rows:
        runs.setdefault(row[0], []).append(row)
    return runs


def flat(runs: dict[str, list[Row]]) -> list[Row]:
    return [row for run_id in sorted(runs) for row in runs[run_id]]


def renumbered(run: list[Row]) -> list[Row]:
    return [(*row[:1], seq, *row[2:]) for seq, row in enumerate(run, 1)]


def changed(value: Any, column: str, rng: random.Random) -> Any:
    """Another value of ``column``'s type."""
    if column in ("at", "started_at"):
        return (value or 0.0) + rng.choice((0.001, -1.0, 3600.0))
    if column in ("epoch", "position", "attempt"):
        return (value or 0) + rng.choice((1, 2, -1))
    if column in ("payload", "digest", "link"):
        if not value:
            return b"forged"
        data = bytearray(value)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if column == "detail":
        found = json.loads(value) if value else {}
        found = found if isinstance(found, dict) else {"value": found}
        found["forged"] = rng.randrange(1000)
        return json.dumps(found)
    if column == "event":
        return "step.completed" if value != "step.completed" else "run.cancelled"
    if column == "tenant":
        return "b" if value != "b" else "a"
    return (value or "") + rng.choice(("x", "-forged", "0"))


def relinked(run: list[Row], start: int) -> list[Row]:
    """``run`` with every link from entry ``start`` on recomputed, as an
    attacker who knows the algorithm would after an edit (and the digest of
    the edited entry recomputed from what it now says, plaintext only)."""
    out = list(run)
    previous = GENESIS if start == 0 else bytes(out[start - 1][COL["link"]])
    for i in range(start, len(out)):
        row = out[i]
        stored = row[COL["digest"]]  # not stored without a keyring: recomputed, as the verifier does
        entry_digest = bytes(stored) if stored is not None else recomputed_digest(row)
        assert entry_digest is not None
        new = link(previous, (*row[:12], row[13]), entry_digest)
        out[i] = (*row[:16], new, row[17])
        previous = new
    return out


class Tamperer:
    def __init__(self, rows: list[Row], backup: list[Row], rng: random.Random) -> None:
        self.rows, self.backup, self.rng = rows, backup, rng
        self.runs = by_run(rows)
        self.backup_runs = by_run(backup)
        self.ids = sorted(self.runs)

    def __call__(self, kind: str) -> list[Row]:
        method: Callable[[], list[Row]] = getattr(self, kind)
        return method()

    def _run(self, least: int = 1) -> tuple[str, dict[str, list[Row]]]:
        runs = {k: list(v) for k, v in self.runs.items()}
        run_id = self.rng.choice([r for r in self.ids if len(runs[r]) >= least])
        return run_id, runs

    def edit(self) -> list[Row]:
        run_id, runs = self._run()
        i = self.rng.randrange(len(runs[run_id]))
        column = self.rng.choice(ENTRY_COLUMNS[2:])
        row = list(runs[run_id][i])
        row[COL[column]] = changed(row[COL[column]], column, self.rng)
        runs[run_id][i] = tuple(row)
        return flat(runs)

    def delete(self) -> list[Row]:
        run_id, runs = self._run(least=2)
        del runs[run_id][self.rng.randrange(len(runs[run_id]) - 1)]  # not the last: that is truncate
        if self.rng.random() < 0.5:  # and renumber the rest, so no seq is missing
            runs[run_id] = renumbered(runs[run_id])
        return flat(runs)

    def insert(self) -> list[Row]:
        run_id, runs = self._run()
        donor = self.rng.choice(self.rows)
        at = self.rng.randrange(len(runs[run_id]) + 1)
        runs[run_id].insert(at, (run_id, 0, *donor[2:17], runs[run_id][0][17]))
        runs[run_id] = renumbered(runs[run_id])
        return flat(runs)

    def reorder(self) -> list[Row]:
        run_id, runs = self._run(least=2)
        run = runs[run_id]
        i, j = sorted(self.rng.sample(range(len(run)), 2))
        run[i], run[j] = run[j], run[i]
        runs[run_id] = renumbered(run)
        return flat(runs)

    def truncate(self) -> list[Row]:
        run_id, runs = self._run()
        cut = self.rng.randrange(1, len(runs[run_id]) + 1)
        runs[run_id] = runs[run_id][:-cut]
        if not runs[run_id]:
            del runs[run_id]
        return flat(runs)

    def rollback(self) -> list[Row]:
        if self.rng.random() < 0.2:
            return list(self.backup)  # the whole database, to the backup copy
        runs = {k: list(v) for k, v in self.runs.items()}
        changed_runs = [r for r in self.ids if self.backup_runs.get(r) != self.runs[r]]
        run_id = self.rng.choice(changed_runs)
        if run_id in self.backup_runs:
            runs[run_id] = list(self.backup_runs[run_id])
        else:
            del runs[run_id]  # it did not exist yet
        return flat(runs)

    def splice(self) -> list[Row]:
        run_id, runs = self._run()
        other = self.rng.choice([r for r in self.ids if r != run_id])
        donor = self.rng.choice(self.runs[other])
        i = self.rng.randrange(len(runs[run_id]))
        target = runs[run_id][i]
        runs[run_id][i] = (run_id, target[1], *donor[2:])  # every column but where it sits
        return flat(runs)

    def forge_actor(self) -> list[Row]:
        run_id, runs = self._run()
        i = self.rng.randrange(len(runs[run_id]))
        row = list(runs[run_id][i])
        how = self.rng.choice(("worker", "epoch", "detail"))
        if how == "worker":
            row[COL["worker"]] = self.rng.choice(("mallory", None, "worker-2")) \
                if row[COL["worker"]] is not None else "mallory"
        elif how == "epoch":
            row[COL["epoch"]] = int(row[COL["epoch"]]) + self.rng.choice((1, -1, 7))
        else:
            found = json.loads(row[COL["detail"]]) if row[COL["detail"]] else {}
            found = found if isinstance(found, dict) else {}
            found["actor"] = "cli:mallory"
            row[COL["detail"]] = json.dumps(found)
        runs[run_id][i] = tuple(row)
        return flat(runs)

    def relink(self) -> list[Row]:
        run_id, runs = self._run()
        i = self.rng.randrange(len(runs[run_id]))
        row = list(runs[run_id][i])
        row[COL["worker"]] = "mallory"
        if row[COL["payload"]] is None and row[COL["detail"]] is not None and not self.rng.randrange(2):
            found = json.loads(row[COL["detail"]])
            found["forged"] = 1
            row[COL["detail"]] = json.dumps(found)
            row[COL["digest"]] = digest(None, found)  # a plaintext detail: its digest recomputed too
        runs[run_id][i] = tuple(row)
        runs[run_id] = relinked(runs[run_id], i)
        return flat(runs)


def verdict(rows: list[Row], tenants: dict[str, str], digester: Any, heads: dict[str, tuple[int, bytes]],
            legacy: dict[str, int]) -> list[Problem]:
    want = {run: seq for run, (seq, _) in heads.items()}
    chains = verify_chains(rows, tenants, digester, want, legacy=legacy)
    return chains.problems + check_anchor(chains, heads, tenants, "the checkpoint")


def quick_verdict(tampered: list[Row], original: dict[str, list[Row]], tenants: dict[str, str], digester: Any,
                  heads: dict[str, tuple[int, bytes]], legacy: dict[str, int]) -> list[Problem]:
    """``verdict`` of ``tampered``, verifying only the runs whose rows differ
    from ``original`` (chains are per run: an untouched run's verdict is the
    original's, which passes), anchored heads of every run checked."""
    now = by_run(tampered)
    touched = {r for r in set(now) | set(original) if now.get(r) != original.get(r)}
    rows = [row for r in sorted(touched) for row in now.get(r, [])]
    touched_heads = {r: h for r, h in heads.items() if r in touched}
    return verdict(rows, tenants, digester, touched_heads, legacy)


def write_back(raw: Raw, rows: list[Row]) -> None:
    """Replace the database's history by ``rows`` (as an attacker with write access would)."""
    raw("DELETE FROM history")
    columns = ", ".join(ENTRY_COLUMNS)
    marks = ", ".join(f":{c}" for c in ENTRY_COLUMNS)
    raw.each(f"INSERT INTO history ({columns}) VALUES ({marks})",
             [dict(zip(ENTRY_COLUMNS, row, strict=True)) for row in rows])


@pytest.mark.slow
def test_every_tampering_of_the_history_is_detected(place: str, sealed: bool) -> None:
    app, _ = made(place, sealed)
    store: Any = app.store
    raw = Raw(place)
    backup = list(store.audit_entries())  # the "backup copy" a rollback restores
    more = [app.start("canary", f"later {i}", tenant="a").run_id for i in range(2)]
    drive(app, more[0], "ok")
    cairn_app: cairn.App = app
    assert cairn_app.store is store
    chains = verify_store(store)
    assert chains.problems == []
    heads = {run: (h.seq, h.link) for run, h in chains.heads.items()}  # the anchored checkpoint
    rows = list(store.audit_entries())
    tenants = store.audit_run_tenants()
    legacy = store.audit_legacy()
    digester = getattr(store, "audit_digest", None)
    assert verdict(rows, tenants, digester, heads, legacy) == []  # the control: untouched rows pass

    rng = random.Random(f"{place[:6]}-{sealed}")
    tamper = Tamperer(rows, backup, rng)
    tried: Counter[str] = Counter()
    missed: list[tuple[str, int]] = []
    for trial in range(TRIALS):
        kind = KINDS[trial % len(KINDS)]
        tampered = tamper(kind)
        if tampered == rows:
            continue  # not a change (cannot happen by construction; never counted)
        tried[kind] += 1
        if not quick_verdict(tampered, tamper.runs, tenants, digester, heads, legacy):
            missed.append((kind, trial))
    print(f"\n{place.split(':')[0]} {'sealed' if sealed else 'plain'}: {sum(tried.values())} trials, "
          f"{sum(tried.values()) - len(missed)} detected; by kind {dict(tried)}")
    assert sum(tried.values()) >= TRIALS - 10
    assert missed == []

    # a sample written into the database itself and verified from there: the same verdicts
    for trial in range(WRITTEN_BACK):
        kind = KINDS[trial % len(KINDS)]
        tampered = tamper(kind)
        write_back(raw, tampered)
        found = verify_store(store, want={run: seq for run, (seq, _) in heads.items()})
        problems = found.problems + check_anchor(found, heads, tenants, "the checkpoint")
        expected = verdict(tampered, tenants, digester, heads, legacy)
        assert [str(p) for p in problems] == [str(p) for p in expected]
        assert problems, f"{kind} written to the database went unnoticed"
    write_back(raw, rows)
    assert verify_store(store).problems == []  # and the original rows, written back, verify again
    app.close()


# -- the operator log (store.oplog): the same kinds of tampering, per tenant's chain ------------------

OPLOG_TRIALS = 3000
OCOL = {name: i for i, name in enumerate(oplog.COLUMNS)}


class Rows:
    """Operator log rows as a store answers them (``operator_log``), for the verifier."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = sorted(rows, key=lambda r: (r[0], r[1]))

    def operator_log(self, tenant: str | None = None) -> list[Row]:
        return [r for r in self.rows if tenant is None or r[0] == tenant]


def oplog_verdict(rows: list[Row], heads: dict[str, tuple[int, bytes]]) -> list[Problem]:
    chains = Chains()
    oplog.verify_into(chains, Rows(rows), want={chain: seq for chain, (seq, _) in heads.items()})
    tenant_of = {chain: oplog.tenant_of_chain(chain) for chain in heads}
    return chains.problems + check_anchor(chains, heads, tenant_of, "the checkpoint")


def oplog_tampered(rows: list[Row], backup: list[Row], kind: str, rng: random.Random) -> list[Row]:
    """``rows`` with one tampering of ``kind``, as an attacker with write access would make it."""
    logs: dict[str, list[Row]] = {}
    for row in rows:
        logs.setdefault(row[0], []).append(row)
    tenant = rng.choice(sorted(t for t in logs if len(logs[t]) >= 2))
    log = logs[tenant]
    i = rng.randrange(len(log))
    row = list(log[i])

    def renumber(items: list[Row]) -> list[Row]:
        return [(item[0], seq, *item[2:]) for seq, item in enumerate(items, 1)]

    if kind in ("edit", "forge_actor", "relink"):
        column = rng.choice(oplog.COLUMNS[2:]) if kind == "edit" else rng.choice(("actor", "auth"))
        value = row[OCOL[column]]
        if column == "at":
            row[OCOL[column]] = value + rng.choice((0.001, -1.0, 3600.0))
        elif column in ("digest", "link"):
            data = bytearray(value)
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            row[OCOL[column]] = bytes(data)
        elif column == "change":
            change = json.loads(value)
            change["forged"] = rng.randrange(1000)
            row[OCOL[column]] = json.dumps(change, sort_keys=True, separators=(",", ":"))
        else:
            row[OCOL[column]] = rng.choice(("cli:mallory@host", "user:mallory", "os-user", "x")) \
                if value != "user:mallory" else "http:forged#1"
        log[i] = tuple(row)
        if kind == "relink":  # the digest and every link from there recomputed, as one knowing the algorithm
            previous = GENESIS if i == 0 else bytes(log[i - 1][OCOL["link"]])
            for j in range(i, len(log)):
                item = list(log[j])
                item[OCOL["digest"]] = oplog.change_digest(item[OCOL["change"]])
                item[OCOL["link"]] = oplog.row_link(previous, tuple(item), item[OCOL["digest"]])
                log[j] = tuple(item)
                previous = item[OCOL["link"]]
    elif kind == "delete":
        del log[rng.randrange(len(log) - 1)]
        if rng.random() < 0.5:
            logs[tenant] = renumber(log)
    elif kind == "insert":
        donor = rng.choice(rows)
        log.insert(rng.randrange(len(log) + 1), (tenant, 0, *donor[2:]))
        logs[tenant] = renumber(log)
    elif kind == "reorder":
        a, b = sorted(rng.sample(range(len(log)), 2))
        log[a], log[b] = log[b], log[a]
        logs[tenant] = renumber(log)
    elif kind == "truncate":
        logs[tenant] = log[:-rng.randrange(1, len(log) + 1)]
    elif kind == "rollback":
        return list(backup)
    elif kind == "splice":  # a record of another tenant's log, put in this one's place
        other = rng.choice([r for r in rows if r[0] != tenant])
        log[i] = (tenant, log[i][1], *other[2:])
    return [r for t in sorted(logs) for r in logs[t]]


def test_every_tampering_of_the_operator_log_is_detected(place: str) -> None:
    app = cairn.App(db=place)
    for i in range(3):
        for tenant in ("a", "b"):
            app.tokens.mint(tenant, "viewer", f"bot-{i}")
        app.operator.set_queue(QueueLimits(f"q{i}", concurrency=i + 1))
    store: Any = app.store
    backup = list(store.operator_log())  # the "backup copy" a rollback restores
    for tenant in ("a", "b"):
        app.operator.set_queue_share(QueueShare("q1", tenant, concurrency=1))
    rows = list(store.operator_log())
    chains = Chains()
    oplog.verify_into(chains, store)
    assert chains.problems == []
    heads = {chain: (h.seq, h.link) for chain, h in chains.heads.items()}  # the anchored checkpoint
    assert oplog_verdict(rows, heads) == []  # the control: untouched rows pass
    rng = random.Random(f"oplog-{place[:6]}")
    tried: Counter[str] = Counter()
    missed: list[tuple[str, int]] = []
    for trial in range(OPLOG_TRIALS):
        kind = KINDS[trial % len(KINDS)]
        tampered = oplog_tampered(rows, backup, kind, rng)
        if tampered == rows:
            continue
        tried[kind] += 1
        if not oplog_verdict(tampered, heads):
            missed.append((kind, trial))
    print(f"\noperator log, {place.split(':')[0]}: {sum(tried.values())} trials, "
          f"{sum(tried.values()) - len(missed)} detected; by kind {dict(tried)}")
    assert sum(tried.values()) >= OPLOG_TRIALS - 10
    assert missed == []
    raw = Raw(place)  # a sample written into the database and verified by the store: the same verdicts
    for trial in range(len(KINDS)):
        tampered = oplog_tampered(rows, backup, KINDS[trial], rng)
        raw("DELETE FROM operator_log")
        raw.each("INSERT INTO operator_log VALUES (:a, :b, :c, :d, :e, :f, :g, :h, :i, :j, :k)",
                 [dict(zip("abcdefghijk", row, strict=True)) for row in tampered])
        stored = oplog_verdict(list(store.operator_log()), heads)
        assert [str(p) for p in stored] == [str(p) for p in oplog_verdict(tampered, heads)]
        assert stored, f"{KINDS[trial]} written to the database went unnoticed"
        unanchored = KINDS[trial] in ("truncate", "rollback", "relink")  # the anchor alone catches these
        assert app.audit.verify().verdict.value == "TAMPERED" or unanchored
    app.close()
