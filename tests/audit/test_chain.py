"""The audit chain as the database writes it (issue 26): every entry of
every write path gets its link, in the transaction that writes it, over the
row as stored; the verifier recomputes each link and names the first bad
entry. Both backends."""

from __future__ import annotations

from typing import Any

import cairn
from cairn.api.auditchain import Chains, verify_chains
from cairn.store.auditlinks import link


def scan(app: cairn.App, **where: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return app.store.audit_scan(lambda entries, links, _: (list(entries), list(links)), **where)


def verify(app: cairn.App, **where: Any) -> Chains:
    return app.store.audit_scan(verify_chains, **where)


def test_every_entry_is_linked_over_its_stored_row(app: cairn.App) -> None:
    app.run("steps", 6, run_id="r1")
    handle = app.start("steps", 2, run_id="r2")
    app.cancel(handle.run_id, "no longer needed")  # an operator's entry
    entries, links = scan(app)
    assert [(e[0], e[1]) for e in entries] == [(k[0], k[1]) for k in links]
    previous: dict[str, bytes] = {}
    for entry, stored in zip(entries, links, strict=True):
        assert link(previous.get(entry[0]), entry) == bytes(stored[3])
        assert stored[2] == entry[2]  # the tenant
        previous[entry[0]] = bytes(stored[3])
    compressed = [e for e in entries if e[13] is not None and e[13][:2] == b"\x00\x01"]
    assert compressed, "the large payload is linked as stored (packed), not as decoded"
    chains = verify(app)
    assert chains.problems == []
    assert chains.entries == len(entries)
    assert set(chains.heads) == {"r1", "r2"}


def test_a_run_is_verified_alone(app: cairn.App) -> None:
    app.run("steps", 3, run_id="a")
    app.run("steps", 3, run_id="b")
    chains = verify(app, run_id="b")
    assert set(chains.heads) == {"b"}
    assert chains.problems == []
    assert verify(app, tenant="nobody").entries == 0
