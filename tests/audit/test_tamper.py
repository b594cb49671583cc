"""The randomized tamper test (issue 26): a real store's history (both
backends) is anchored, then tampered with in memory, 10,000 trials per
backend, each a fresh copy of the stored rows: edit a column, delete an entry
(with or without its link), insert one, reorder two, cut the tail, roll runs
back to a backup taken earlier, splice an entry from another run, forge an
actor, edit a link. Half the attackers also relink the run they touched
from the first change on, as anyone who can write the database can (the hash
is keyless): those only the anchor catches. Every trial must be judged
TAMPERED; the untouched rows VERIFIED.

The verifier is the one ``cairn audit verify`` runs (``verify_chains`` and
``judge``), fed the rows as the store returned them."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.api import auditanchor
from cairn.api.audit import Verdict, judge
from cairn.api.auditanchor import Checkpoint
from cairn.api.auditchain import verify_chains
from cairn.store.auditlinks import link

TRIALS = 10_000

Row = tuple[Any, ...]


def rows(app: cairn.App) -> tuple[list[Row], list[Row]]:
    return app.store.audit_scan(lambda e, lk, _: ([tuple(r) for r in e], [tuple(r) for r in lk]))


def build(app: cairn.App, tmp_path: Path) -> tuple[list[Row], list[Row], list[Row], list[Row], Path, Path]:
    """Runs of two tenants, operator actions among them; a backup of the
    rows; more history; a checkpoint anchored over all of it."""
    for i in range(6):
        app.run("steps", 3 + i, run_id=f"r{i}", tenant="acme" if i % 2 else "globex")
    for i in range(3):
        handle = app.start("steps", 2, run_id=f"p{i}", tenant="acme")
        app.cancel(handle.run_id, f"operator {i} says no")
    app.start("steps", 4, run_id="w0", tenant="globex")
    backup_entries, backup_links = rows(app)
    app.resume("w0")  # a run the backup has only the start of
    for i in range(3):
        app.run("steps", 2, run_id=f"late{i}", tenant="acme")
    key = tmp_path / "audit.key"
    auditanchor.generate_key(key)
    anchor = tmp_path / "anchor.jsonl"
    app.audit.checkpoint(key, anchor=anchor)
    entries, links = rows(app)
    return entries, links, backup_entries, backup_links, key, anchor


def judged(entries: list[Row], links: list[Row], checkpoints: dict[str, Checkpoint]) -> Verdict:
    entries = sorted(entries, key=lambda r: (str(r[0]), int(r[1])))
    links = sorted(links, key=lambda r: (str(r[0]), int(r[1])))
    linked = {r[0] for r in links}
    want = {run: seq for c in checkpoints.values() for run, (seq, _) in c.heads.items()}
    chains = verify_chains(entries, links, lambda run: run in linked, want)
    return judge(chains, checkpoints, True, None, lambda run: None).verdict


# -- the attacks: each returns the tampered rows and the runs it touched -------------------------


def _mutate(value: Any, rng: random.Random) -> Any:
    if value is None:
        return rng.choice(["x", 1, 0.5, b"\x01"])
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1, 7])
    if isinstance(value, float):
        return value + rng.choice([-1e-3, 1e-6, 60.0])
    if isinstance(value, str):
        if value and rng.random() < 0.5:
            i = rng.randrange(len(value))
            return value[:i] + chr((ord(value[i]) % 0x7e) + 1) + value[i + 1:]
        return value + rng.choice(["x", " ", "\u00e9"])
    if isinstance(value, bytes):
        if value:
            i = rng.randrange(len(value))
            return value[:i] + bytes([value[i] ^ (1 << rng.randrange(8))]) + value[i + 1:]
        return b"\x00"
    raise AssertionError(type(value))


def edit(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    i = rng.randrange(len(e))
    column = rng.randrange(len(e[i]))
    row = list(e[i])
    row[column] = _mutate(row[column], rng)
    e[i] = tuple(row)
    return {str(e[i][0]), str(row[0])}


def forge_actor(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    acted = [i for i, r in enumerate(e) if r[6] is not None or (r[15] and "actor" in r[15])]
    i = rng.choice(acted)
    row = list(e[i])
    if row[15] and "actor" in row[15] and (row[6] is None or rng.random() < 0.5):
        detail = json.loads(row[15])
        held = detail.get("started_by", detail)  # who started it, or who acted
        held["actor"] = rng.choice(["cli:mallory@host", "http:admin#t0", "app:1", held["actor"] + "!"])
        row[15] = json.dumps(detail, separators=(",", ":"))
    else:
        row[6] = rng.choice(["worker-evil", str(row[6]) + "x"])
    e[i] = tuple(row)
    return {str(row[0])}


def delete(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    i = rng.randrange(len(e))
    gone = e.pop(i)
    if rng.random() < 0.5:
        lk[:] = [r for r in lk if (r[0], r[1]) != (gone[0], gone[1])]
    if rng.random() < 0.5:  # and renumber what followed, as a careful attacker would
        e[:] = [(*r[:1], r[1] - 1, *r[2:]) if r[0] == gone[0] and r[1] > gone[1] else r for r in e]
        lk[:] = [r for r in lk if not (r[0] == gone[0] and r[1] >= gone[1])]
        lk.extend((r[0], r[1], r[2], b"") for r in e if r[0] == gone[0] and r[1] >= gone[1])
    return {str(gone[0])}


def insert(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    model = list(rng.choice(e))
    run = model[0]
    last = max(r[1] for r in e if r[0] == run)
    seq = rng.randint(1, last)  # into the anchored history (after it: test_a_forged_append_is_unanchored)
    e[:] = [(*r[:1], r[1] + 1, *r[2:]) if r[0] == run and r[1] >= seq else r for r in e]
    model[1] = seq
    model[3] = rng.choice(["step.completed", "run.cancelled", str(model[3])])
    e.append(tuple(model))
    lk[:] = [r for r in lk if not (r[0] == run and r[1] >= seq)]
    lk.extend((r[0], r[1], r[2], b"") for r in e if r[0] == run and r[1] >= seq)
    return {str(run)}


def reorder(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    runs = sorted({r[0] for r in e if sum(1 for x in e if x[0] == r[0]) > 1})
    run = rng.choice(runs)
    mine = [i for i, r in enumerate(e) if r[0] == run]
    a, b = rng.sample(mine, 2)
    if e[a][2:] == e[b][2:]:
        raise _NoOp
    e[a], e[b] = (*e[a][:2], *e[b][2:]), (*e[b][:2], *e[a][2:])
    return {str(run)}


def truncate(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    run = rng.choice(sorted({r[0] for r in e}))
    last = max(r[1] for r in e if r[0] == run)
    cut = rng.randint(1, last)
    e[:] = [r for r in e if not (r[0] == run and r[1] >= cut)]
    if rng.random() < 0.7:
        lk[:] = [r for r in lk if not (r[0] == run and r[1] >= cut)]
    return {str(run)}


def rollback(e: list[Row], lk: list[Row], rng: random.Random,
             backup: tuple[list[Row], list[Row]]) -> set[str]:
    entries, links = backup
    before = set(entries)
    changed = sorted({r[0] for r in e if r not in before})
    runs = set(rng.sample(changed, rng.randint(1, len(changed)))) if rng.random() < 0.7 else set(changed)
    e[:] = [r for r in e if r[0] not in runs] + [r for r in entries if r[0] in runs]
    lk[:] = [r for r in lk if r[0] not in runs] + [r for r in links if r[0] in runs]
    return set()  # the backup's links are genuine: no relinking


def splice(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    runs = sorted({r[0] for r in e})
    source, target = rng.sample(runs, 2)
    moved = list(rng.choice([r for r in e if r[0] == source]))
    last = max(r[1] for r in e if r[0] == target)
    seq = rng.randint(1, last)
    moved[0], moved[1] = target, seq
    if rng.random() < 0.5:
        moved[2] = next(r[2] for r in e if r[0] == target)  # and pass it off as the target's tenant
    e[:] = [r for r in e if not (r[0] == target and r[1] == seq)] + [tuple(moved)]
    return {str(target)}


def edit_link(e: list[Row], lk: list[Row], rng: random.Random, _: Any) -> set[str]:
    i = rng.randrange(len(lk))
    row = list(lk[i])
    row[3] = _mutate(bytes(row[3]), rng)
    lk[i] = tuple(row)
    return set()


class _NoOp(Exception):
    """The attack drew a change that changes nothing: draw again."""


ATTACKS: dict[str, Callable[..., set[str]]] = {
    "edit": edit, "forge_actor": forge_actor, "delete": delete, "insert": insert, "reorder": reorder,
    "truncate": truncate, "rollback": rollback, "splice": splice, "edit_link": edit_link,
}


def anchored_part(rows: list[Row], heads: dict[str, int]) -> list[Row]:
    """The rows an anchor covers: those of its runs up to their anchored heads."""
    return sorted(r for r in rows if r[0] not in heads or not isinstance(r[1], int) or r[1] <= heads[r[0]])


def relink(e: list[Row], lk: list[Row], runs: set[str]) -> None:
    """Recompute the links of ``runs`` from their first entry, as an
    attacker with write access to the database would."""
    lk[:] = [r for r in lk if r[0] not in runs]
    previous: dict[str, bytes] = {}
    for row in sorted((r for r in e if r[0] in runs), key=lambda r: (str(r[0]), int(r[1]))):
        value = link(previous.get(row[0]), row)
        lk.append((row[0], row[1], row[2], value))
        previous[row[0]] = value


def test_every_tampering_is_detected(app: cairn.App, tmp_path: Path) -> None:
    entries, links, backup_entries, backup_links, key, anchor = build(app, tmp_path)
    checkpoints = auditanchor.latest(anchor, auditanchor.load_public(key))
    assert judged(entries, links, checkpoints) is Verdict.VERIFIED
    assert app.audit.verify(anchor=anchor, key=key).verdict is Verdict.VERIFIED
    heads = {run: seq for c in checkpoints.values() for run, (seq, _) in c.heads.items()}
    rng = random.Random(26)
    counts: dict[str, int] = dict.fromkeys(ATTACKS, 0)
    missed: list[str] = []
    trials = 0
    while trials < TRIALS:
        name = rng.choice(sorted(ATTACKS))
        e, lk = list(entries), list(links)
        try:
            touched = ATTACKS[name](e, lk, rng, (backup_entries, backup_links))
        except _NoOp:
            continue
        relinked = bool(touched) and rng.random() < 0.5
        if relinked:
            relink(e, lk, touched)
        if anchored_part(e, heads) == anchored_part(entries, heads) and \
                anchored_part(lk, heads) == anchored_part(links, heads):
            continue  # drew no change to the anchored history (at most an append after it)
        trials += 1
        counts[name] += 1
        if judged(e, lk, checkpoints) is not Verdict.TAMPERED:
            missed.append(f"{name} (relinked: {relinked})")
    assert missed == [], f"{len(missed)} of {TRIALS} tamperings passed: {missed[:5]}"
    assert min(counts.values()) > TRIALS // 20, counts


def test_a_forged_append_is_unanchored_never_verified(app: cairn.App, tmp_path: Path) -> None:
    """An entry appended after the anchored head, correctly linked, is what
    a real append looks like: the verdict says it is not covered by the
    anchor (UNANCHORED), never VERIFIED."""
    entries, links, *_, key, anchor = build(app, tmp_path)
    checkpoints = auditanchor.latest(anchor, auditanchor.load_public(key))
    e, lk = list(entries), list(links)
    model = list(next(r for r in e if r[0] == "r3" and r[3] == "step.completed"))
    model[1] = max(r[1] for r in e if r[0] == "r3") + 1
    e.append(tuple(model))
    relink(e, lk, {"r3"})
    assert judged(e, lk, checkpoints) is Verdict.UNANCHORED


def test_without_an_anchor_a_relinked_rewrite_is_unanchored_never_verified(app: cairn.App,
                                                                          tmp_path: Path) -> None:
    entries, links, *_ = build(app, tmp_path)
    e, lk = list(entries), list(links)
    rng = random.Random(1)
    relink(e, lk, edit(e, lk, rng, None))
    assert judged(e, lk, {}) is Verdict.UNANCHORED
    assert app.audit.verify().verdict is Verdict.UNANCHORED


@pytest.mark.parametrize("damage", ["edit", "delete", "truncate", "relink"])
def test_audit_verify_names_the_first_bad_entry_in_the_database(app: cairn.App, tmp_path: Path,
                                                               damage: str) -> None:
    """The same attacks, on the database itself, through ``App.audit.verify``."""
    *_, key, anchor = build(app, tmp_path)
    statements = {
        "edit": ("UPDATE history SET detail = replace(detail, 'operator 1', 'operator 9') "
                 "WHERE run_id = 'p1' AND event = 'run.cancelled'"),
        "delete": "DELETE FROM history WHERE run_id = 'r3' AND seq = 4",
        "truncate": ("DELETE FROM audit_links WHERE run_id = 'r4' AND seq > 3; "
                     "DELETE FROM history WHERE run_id = 'r4' AND seq > 3"),
        "relink": "UPDATE history SET worker = 'mallory' WHERE run_id = 'r5' AND seq = 2",
    }
    raw(app, statements[damage])
    if damage == "relink":
        entries, _ = rows(app)
        mine = [r for r in entries if r[0] == "r5"]
        previous = None
        for row in mine:
            previous = link(previous, row)
            raw(app, "UPDATE audit_links SET link = {} WHERE run_id = 'r5' AND seq = {}".format(
                ("X'" if is_sqlite(app) else "'\\x") + previous.hex() + "'", row[1]))
        assert app.audit.verify().verdict is Verdict.UNANCHORED  # the chain alone cannot tell
    report = app.audit.verify(anchor=anchor, key=key)
    assert report.verdict is Verdict.TAMPERED
    first = report.problems[0]
    expected = {"edit": ("p1", 2), "delete": ("r3", 4), "truncate": ("r4", 4), "relink": ("r5", None)}[damage]
    assert first.run_id == expected[0]
    if expected[1] is not None:
        assert first.seq == expected[1], report.summary()
    assert report.summary().startswith(f"TAMPERED: run {expected[0]!r}")


def is_sqlite(app: cairn.App) -> bool:
    return type(app.store).__name__ == "SQLiteStore"


def raw(app: cairn.App, statements: str) -> None:
    """Change the database behind Cairn's back."""
    if is_sqlite(app):
        import sqlite3

        conn = sqlite3.connect(app.store.path)  # type: ignore[attr-defined]
        conn.executescript(statements)
        conn.close()
        return
    import psycopg

    url = app.db_url
    assert url is not None
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute("SET search_path = cairn")
        for statement in statements.split(";"):
            if statement.strip():
                conn.execute(statement.encode())
