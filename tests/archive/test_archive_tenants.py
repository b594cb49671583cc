"""A tenant's archives under PostgreSQL's row-level security: the owner
archives (moving a run's rows deletes history, which a tenant's role may
not); the tenant's own role reads its archived run transparently; another
tenant's role can neither see the archive record, read the object, nor
forge, drop or restore a record."""

from __future__ import annotations

import psycopg
import pytest

from cairn.errors import PayloadError, RunNotFound, StoreError
from cairn.store.records import EventType, Payload
from tests.store.contract import claim, ev, finish, new_run
from tests.store.test_postgres_rls import Deployment, deployment

__all__ = ["deployment"]

INSERT = ("INSERT INTO run_archives (run_id, tenant, ref, entries, last_seq, hot_bytes, stored_bytes, "
          "archived_at) VALUES ('a1', %s, %s, 1, 1, 1, 1, 0)")


def test_another_tenant_cannot_read_forge_or_drop_an_archive(deployment: Deployment) -> None:
    d = deployment
    d.acme.create_run(new_run("a1", tenant="acme", input=Payload(b"secret input")))
    c = claim(d.acme, "a1")
    d.acme.append("a1", c.run.epoch, [ev(d.clock, "a1", c.next_seq, c.run.epoch, payload=Payload(b"s" * 50))])
    finish(d.acme, d.clock, c, seq=c.next_seq + 1)
    history = d.acme.history("a1")
    with pytest.raises(StoreError, match="cannot archive"):
        d.acme.archive_run("a1")
    record = d.owner.archive_run("a1", actor="ops")
    assert d.acme.history("a1") == history  # its own role reads the archive through its record
    assert d.acme.get_artifact(record.ref)
    with pytest.raises(StoreError, match="cannot archive or restore"):
        d.acme.restore_run("a1")

    assert d.globex.run_archive("a1") is None
    assert d.globex.history("a1") == []
    with pytest.raises(PayloadError, match="missing"):  # the artifacts policy: no record of its own names it
        d.globex.get_artifact(record.ref)
    assert d.as_role("globex", "SELECT count(*) FROM run_archives") == [(0,)]
    for forged in (("globex", record.ref), ("acme", record.ref)):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            d.as_role("globex", INSERT, forged)
    for role in ("globex", "acme"):  # not even its own tenant's role unfreezes the run
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            d.as_role(role, "DELETE FROM run_archives WHERE run_id = 'a1'")
    with pytest.raises(RunNotFound):
        d.owner.restore_run("a2")
    d.owner.restore_run("a1")
    assert d.acme.history("a1") == history
    assert [e.event for e in history][-1] is EventType.RUN_COMPLETED
