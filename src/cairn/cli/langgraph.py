"""``cairn langgraph history|state|diff``: time travel over the LangGraph
threads ``cairn.langgraph.CairnSaver`` stores (issue 24, part 3).

A thread belongs to a tenant (``--tenant``, default ``default``): another
tenant's thread is "not found". The readers need no graph code: values are
decoded with the saver's default serializer (LangGraph's safe types), so a
thread holding types outside it is refused naming the checkpoint, as the saver
refuses it. Bad input (a thread or checkpoint that does not exist, a damaged
row) is one line and exit status 2; without the ``langgraph`` extra, one line
saying so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from cairn.errors import InvalidArgument, MissingExtra, PayloadError
from cairn.graph.diff import Change, to_json

from .graph import _change_line
from .loading import open_session
from .options import db_from_context, db_option
from .terminal import echo, echo_json


class BadInput(click.ClickException):
    """Bad input to a ``cairn langgraph`` command: one line, exit status 2."""

    exit_code = 2


@contextmanager
def _saver(ctx: click.Context, db: str | None, tenant: str) -> Iterator[Any]:
    """A ``CairnSaver`` of ``tenant`` on the database, read only."""
    try:
        from cairn.langgraph import CairnSaver
    except MissingExtra as exc:
        raise BadInput(str(exc)) from None
    try:
        with open_session(db_from_context(ctx, db), None, read_only=True) as session:
            yield CairnSaver(session.app, tenant=tenant)
    except (InvalidArgument, PayloadError, TypeError) as exc:
        raise BadInput(str(exc)) from None


def _tenant_option(f: Any) -> Any:
    return click.option("--tenant", default="default", show_default=True,
                        help="The tenant whose thread it is.")(f)


def _ns_option(f: Any) -> Any:
    return click.option("--ns", default="", help="A subgraph's checkpoint namespace.")(f)


@click.group("langgraph")
def langgraph() -> None:
    """Time travel over LangGraph threads stored by CairnSaver: history, states, diffs."""


@langgraph.command("history")
@click.argument("thread_id", metavar="THREAD")
@click.option("--before", metavar="CHECKPOINT", default=None, help="Only checkpoints older than this one.")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the page.")
@_tenant_option
@_ns_option
@db_option
@click.pass_context
def history(ctx: click.Context, thread_id: str, before: str | None, limit: int, as_json: bool, tenant: str,
            ns: str, db: str | None) -> None:
    """The thread's checkpoints, newest first: id, step, source and parent."""
    with _saver(ctx, db, tenant) as saver:
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
        after = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": before}}
        found = list(saver.list(config, before=after if before else None, limit=limit + 1))
    page = [{"checkpoint_id": t.config["configurable"]["checkpoint_id"],
             "parent_id": t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None,
             "step": t.metadata.get("step"), "source": t.metadata.get("source"),
             "at": t.checkpoint.get("ts")} for t in found[:limit]]
    more = page[-1]["checkpoint_id"] if len(found) > limit else None
    if as_json:
        echo_json({"thread_id": thread_id, "tenant": tenant, "ns": ns, "checkpoints": page,
                   "next_before": more}, indent=2)
        return
    if not page:
        raise BadInput(f"LangGraph thread {thread_id!r} of tenant {tenant!r} has no checkpoint"
                       + (" before that one" if before else ""))
    for c in page:
        echo(f"{c['checkpoint_id']}  step {c['step']!s:>5}  {c['source'] or '-':<6}  {c['at'] or ''}")
    if more is not None:
        echo(f"(more: --before {more})")


@langgraph.command("state")
@click.argument("thread_id", metavar="THREAD")
@click.option("--checkpoint", "checkpoint_id", default=None, help="The checkpoint (default: the latest).")
@click.option("--internal", is_flag=True, help="Include LangGraph's own channels (branch:to:..., __start__).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: thread, checkpoint and values.")
@_tenant_option
@_ns_option
@db_option
@click.pass_context
def state(ctx: click.Context, thread_id: str, checkpoint_id: str | None, internal: bool, as_json: bool,
          tenant: str, ns: str, db: str | None) -> None:
    """The thread's channel values at a checkpoint, as JSON."""
    with _saver(ctx, db, tenant) as saver:
        values = saver.values(thread_id, checkpoint_id, ns=ns, internal=internal)
        # to_json checks each value is JSON-like (a message: the dict of its fields)
        plain = {c["path"][0]: c["new"] for c in to_json(Change((k,), "added", None, v)
                                                          for k, v in values.items())}
    if as_json:
        echo_json({"thread_id": thread_id, "tenant": tenant, "ns": ns, "checkpoint_id": checkpoint_id,
                   "values": plain}, indent=2)
    else:
        echo_json(plain, indent=2)


@langgraph.command("diff")
@click.argument("thread_id", metavar="THREAD")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B", required=False)
@click.option("--other", metavar="THREAD2", default=None, help="Checkpoint B is of this thread.")
@click.option("--internal", is_flag=True, help="Include LangGraph's own channels.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the changes.")
@_tenant_option
@_ns_option
@db_option
@click.pass_context
def diff(ctx: click.Context, thread_id: str, a: str, b: str | None, other: str | None, internal: bool,
         as_json: bool, tenant: str, ns: str, db: str | None) -> None:
    """What changed from checkpoint A of THREAD to checkpoint B (default:
    the latest; of THREAD2 with --other): appends as appends, dict changes
    by key path, replaced values old -> new."""
    with _saver(ctx, db, tenant) as saver:
        changes = saver.diff(thread_id, a, b, other_thread=other, ns=ns, internal=internal)
        plain = to_json(changes)
    if as_json:
        echo_json({"thread_id": thread_id, "a": a, "other_thread": other or thread_id, "b": b,
                   "tenant": tenant, "ns": ns, "changes": plain}, indent=2)
    elif not changes:
        echo("no change")
    else:
        for change in changes:
            echo(_change_line(change))
