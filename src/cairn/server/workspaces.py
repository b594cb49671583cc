"""``/api/runs/{run_id}/workspace``: a run's workspace snapshots over HTTP
(``api.workspaces``, read-only): the snapshots its live journal records,
the files of one (by the journal position of the step that recorded it, or
``latest``), and the diff of two.

A run of another tenant is 404 as an unknown one; a run that recorded no
snapshot is 422, a position the run has no snapshot at 404; a stored object that fails its checks (damaged, or
hostile) is 422 with nothing returned of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cairn.api.tokens import Role
from cairn.api.workspaces import NoSnapshot
from cairn.errors import InvalidArgument, RunNotFound, WorkspaceError
from cairn.server.errors import ApiError
from cairn.server.routing import Call, Endpoint
from cairn.server.runs import RUN

WORKSPACE = RUN + "/workspace"
_KINDS = {"f": "file", "d": "dir", "l": "symlink"}


def _position(call: Call[Any], name: str) -> int | None:
    raw = call.path[name]
    if raw == "latest":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ApiError(400, "invalid", f"{name} must be a journal position (a non-negative integer) or "
                                       f"'latest', not {raw[:40]!r}")
    return int(raw)


@contextmanager
def _answered() -> Iterator[None]:
    try:
        yield
    except RunNotFound:
        raise
    except NoSnapshot as exc:  # none at that position
        raise ApiError(404, "not_found", str(exc)) from None
    except InvalidArgument as exc:  # the run has recorded none at all
        raise ApiError(422, "invalid", str(exc)) from None
    except WorkspaceError as exc:  # damaged, hostile or missing objects
        raise ApiError(422, "invalid", str(exc)) from None


def _text(ref: str | bytes) -> str:
    return ref.decode("utf-8", "surrogateescape").encode("utf-8", "backslashreplace").decode() \
        if isinstance(ref, bytes) else ref


def list_snapshots(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    with _answered():
        shots = call.operator.workspaces.snapshots(record.run_id)
    return {"run_id": record.run_id, "snapshots": [s.as_dict() for s in shots]}


def snapshot_files(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    position = _position(call, "position")
    with _answered():
        shot, files = call.operator.workspaces.files(record.run_id, position)
    return {"snapshot": shot.as_dict(), "files": [
        {"path": _text(path), "kind": _KINDS[e.kind], "mode": oct(e.mode), "size": e.size,
         **({"target": _text(e.ref)} if e.kind == "l" else {"id": e.ref})} for path, e in files]}


def diff_snapshots(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    a, b = _position(call, "a"), _position(call, "b")
    with _answered():
        if a is None:
            raise ApiError(400, "invalid", "a must be a journal position")
        before, after, changes = call.operator.workspaces.diff(record.run_id, a, b)
    return {"old": before.as_dict() if before else None, "new": after.as_dict(),
            "changes": [{**c.as_dict(), "path": _text(c.path)} for c in changes]}


ROUTES = [
    Endpoint("GET", WORKSPACE, Role.VIEWER, "The workspace snapshots a run recorded, oldest first",
             list_snapshots, tag="workspaces"),
    Endpoint("GET", WORKSPACE + "/{position}", Role.VIEWER, "The files of the snapshot recorded at a "
             "journal position ('latest': the run's latest)", snapshot_files, tag="workspaces"),
    Endpoint("GET", WORKSPACE + "/{a}/diff/{b}", Role.VIEWER, "What changed in the workspace from the "
             "snapshot at position a to the one at b ('latest')", diff_snapshots, tag="workspaces"),
]
