"""``cairn workspace ls|diff|restore|export RUN [POSITION]``: a run's
workspace snapshots (``api.workspaces``), read through the operator façade;
``cairn workspace gc``: delete the objects no recorded snapshot needs
(``api.wscollect``).

POSITION is the journal position of the step or tool whose entry records
the snapshot (``cairn workspace ls RUN --snapshots`` lists them); without
it, the run's latest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cairn.workspace.objects import LINK

from .database import parse_duration
from .loading import open_session
from .options import app_option, db_from_context, db_option
from .terminal import echo, echo_json

_KINDS = {"f": "file", "d": "dir", "l": "symlink"}


def _common(fn: Any) -> Any:
    options: list[Any] = [click.option("--json", "as_json", is_flag=True, help="JSON output."),
                          app_option(required=False), db_option, click.pass_context]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.group("workspace")
def workspace() -> None:
    """Runs' workspaces: the snapshot each step recorded, their diffs, checkouts and a git export."""


@workspace.command("ls")
@_common
@click.argument("run_id")
@click.argument("position", type=int, required=False)
@click.option("--snapshots", is_flag=True, help="List the run's snapshots instead of a snapshot's files.")
@click.option("--branches", is_flag=True,
              help="With --snapshots: the parallel graph branches' snapshots too (marked step.index).")
def ls(ctx: click.Context, as_json: bool, app_spec: str | None, db: str | None, run_id: str,
       position: int | None, snapshots: bool, branches: bool) -> None:
    """The files of a snapshot (default: the latest), or the run's snapshots."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        views = session.operator.workspaces
        if snapshots:
            shots = views.snapshots(run_id, branches=branches)
            if as_json:
                echo_json([s.as_dict() for s in shots], indent=2)
                return
            for s in shots:
                line = "" if s.branch is None else f"  branch {s.branch[0]}.{s.branch[1]}"
                echo(f"{s.position:>6}  {s.kind:<5} {s.name:<24} {s.root[:16]}{line}")
            if not shots:
                echo(f"run {run_id} has recorded no workspace snapshot", err=True)
            return
        shot, files = views.files(run_id, position)
    if as_json:
        echo_json({"snapshot": shot.as_dict(), "files": [
            {"path": path, "kind": _KINDS[e.kind], "mode": oct(e.mode), "size": e.size,
             **({"target": _text(e.ref)} if e.kind == LINK else {"id": e.ref})} for path, e in files]},
            indent=2)
        return
    echo(f"run {run_id} position {shot.position} ({shot.kind} {shot.name}) root {shot.root[:16]}", err=True)
    for path, e in files:
        suffix = f" -> {_text(e.ref)}" if e.kind == LINK else ("/" if e.kind == "d" else "")
        echo(f"{oct(e.mode)[2:]:>4} {e.size:>10}  {path}{suffix}")


@workspace.command("diff")
@_common
@click.argument("run_id")
@click.argument("old", type=int, required=False)
@click.argument("new", type=int, required=False)
def diff_command(ctx: click.Context, as_json: bool, app_spec: str | None, db: str | None, run_id: str,
                 old: int | None, new: int | None) -> None:
    """What changed between two snapshots (positions OLD and NEW; one
    position: from the snapshot before it; none: the latest's change)."""
    if old is not None and new is None:
        old, new = None, old
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        before, after, changes = session.operator.workspaces.diff(run_id, old, new)
    if as_json:
        echo_json({"old": before.as_dict() if before else None, "new": after.as_dict(),
                   "changes": [c.as_dict() for c in changes]}, indent=2)
        return
    echo(f"run {run_id}: position {before.position if before else '(empty)'} -> {after.position}", err=True)
    marks = {"added": "A", "removed": "D", "modified": "M"}
    for c in changes:
        echo(f"{marks[c.change]}  {c.path}")


@workspace.command("restore")
@_common
@click.argument("run_id")
@click.argument("position", type=int, required=False)
@click.option("--to", "dest", required=True, type=click.Path(path_type=Path),
              help="The directory to write the snapshot into (new or empty).")
@click.option("--force", is_flag=True,
              help="Make a non-empty directory exactly the snapshot (deletes the rest).")
def restore_command(ctx: click.Context, as_json: bool, app_spec: str | None, db: str | None, run_id: str,
                    position: int | None, dest: Path, force: bool) -> None:
    """Write a snapshot (default: the latest) into a directory, exactly."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        shot, done = session.operator.workspaces.restore(run_id, position, dest, force=force)
    if as_json:
        echo_json({"snapshot": shot.as_dict(), "path": str(dest), "written": done.written,
                   "kept": done.kept, "removed": done.removed, "bytes": done.written_bytes})
        return
    echo(f"restored run {run_id} position {shot.position} into {dest}: {done.written} written, "
         f"{done.kept} kept, {done.removed} removed")


@workspace.command("export")
@_common
@click.argument("run_id")
@click.option("--to", "dest", required=True, type=click.Path(path_type=Path),
              help="The directory of the new git repository (new or empty).")
def export_command(ctx: click.Context, as_json: bool, app_spec: str | None, db: str | None, run_id: str,
                   dest: Path) -> None:
    """A git repository with one commit per snapshot of the run, oldest first."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        commits = session.operator.workspaces.export_git(run_id, dest)
    if as_json:
        echo_json({"path": str(dest), "commits": [{"commit": c, **s.as_dict()} for s, c in commits]})
        return
    for shot, commit in commits:
        echo(f"{commit[:12]}  position {shot.position}  {shot.kind} {shot.name}")
    echo(f"exported {len(commits)} snapshot(s) of run {run_id} to {dest}", err=True)


@workspace.command("gc")
@_common
@click.option("--tenant", default=None, help="Collect one tenant's objects (default: every tenant's).")
@click.option("--grace", "grace", default="1h", show_default=True, metavar="DURATION",
              help="Keep objects stored less than this long ago (a snapshot being recorded needs them).")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
def gc_command(ctx: click.Context, as_json: bool, app_spec: str | None, db: str | None, tenant: str | None,
               grace: str, dry_run: bool) -> None:
    """Delete workspace objects that no snapshot recorded by an existing run needs.

    Safe while runs take snapshots: an object stored (or stored again) after
    the collection began is never deleted. Stops with nothing deleted if a
    recorded snapshot cannot be read whole."""
    seconds = parse_duration(grace, "--grace")
    with open_session(db_from_context(ctx, db), app_spec) as session:
        found = session.operator.workspaces.collect(tenant, grace_seconds=seconds, dry_run=dry_run)
    if as_json:
        echo_json({"dry_run": dry_run, "tenants": [c.as_dict() for c in found]})
        return
    for c in found:
        verb = "would delete" if dry_run else "deleted"
        echo(f"tenant {c.tenant}: {c.roots} snapshot(s) reach {c.reachable} object(s); {verb} {c.deleted} of "
             f"{c.examined} older than {grace}")


def _text(ref: str | bytes) -> str:
    return ref.decode("utf-8", "surrogateescape") if isinstance(ref, bytes) else ref


__all__ = ["workspace"]
