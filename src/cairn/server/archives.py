"""``/api/runs/{run_id}/archive`` and ``/restore``: hot / cold tiers of a
closed run over the API (issue 26 item 5; ``Operator.archive_run``,
``restore``, ``run_archive``).

Within the token's tenant only: another tenant's run is the 404 an unknown
id gets, as on every run route. Moving rows is an operator's action (the
token's identity recorded as the archive's or the restore's actor, in the
operator log); where a run is archived is a read, as the run itself is.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cairn.api.tokens import Role
from cairn.server.routing import Call, Endpoint
from cairn.store.records import ArchiveRecord


class ArchiveOut(msgspec.Struct, kw_only=True):
    """A run's archive record: its object, its entries, the bytes of its
    rows and of the object, when and by whom it was archived; after a
    restore, by whom and when it was put back."""

    run_id: str
    tenant: str
    ref: str
    entries: int
    last_seq: int
    rows_bytes: int
    stored_bytes: int
    archived_at: float
    actor: str | None
    restored_by: str | None = None
    restored_at: float | None = None


class ShowOut(msgspec.Struct, kw_only=True):
    """Whether the run is archived, and its archive record if it is (``None`` while hot)."""

    run_id: str
    archived: bool
    archive: ArchiveOut | None


def archive_json(record: ArchiveRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "tenant": record.tenant, "ref": record.ref, "entries": record.entries,
            "last_seq": record.last_seq, "rows_bytes": record.hot_bytes, "stored_bytes": record.stored_bytes,
            "archived_at": record.archived_at, "actor": record.actor, "restored_by": record.restored_by,
            "restored_at": record.restored_at}


def archive_run(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    return archive_json(call.operator.archive_run(record.run_id))


def restore_run(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    return archive_json(call.operator.restore(record.run_id))


def show_archive(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    found = call.operator.run_archive(record.run_id)
    return {"run_id": record.run_id, "archived": found is not None,
            "archive": None if found is None else archive_json(found)}


RUN = "/api/runs/{run_id}"

ROUTES = [
    Endpoint("POST", RUN + "/archive", Role.OPERATOR, "Archive the closed run: its rows move out of the hot "
             "tables into one compressed (sealed) object; it still shows, exports and verifies",
             archive_run, status=201, tag="archives", response=ArchiveOut),
    Endpoint("GET", RUN + "/archive", Role.VIEWER, "Whether the run is archived, and where",
             show_archive, tag="archives", response=ShowOut),
    Endpoint("POST", RUN + "/restore", Role.OPERATOR, "Put the archived run's rows back in the hot tables, "
             "bit for bit", restore_run, tag="archives", response=ArchiveOut),
]
