"""``cairn memory ls|get|search|rm``: look into the memory tiers, and delete.

Namespaces are written as labels separated by ``/`` (``--namespace
users/u1/prefs``); a label that itself contains ``/`` is given with a
repeated ``--label`` instead (``--label 'a/b' --label c``), one label each,
verbatim. Every command reads through the operator façade, never the store;
``rm`` records the operator as the actor of the deletion (in the log line).
"""

from __future__ import annotations

import json
from typing import Any

import click

from cairn.errors import InvalidArgument
from cairn.memory.api import Item, Message

from .loading import open_session
from .options import app_option, db_from_context, db_option
from .terminal import echo, echo_json

_PREVIEW = 80


def _namespace(namespace: str | None, labels: tuple[str, ...]) -> tuple[str, ...] | None:
    """The labels of ``--namespace a/b`` or of repeated ``--label``; ``None`` for neither."""
    if namespace is not None and labels:
        raise InvalidArgument("give the namespace with --namespace or with --label, not both")
    if labels:
        return labels
    if namespace is None:
        return None
    parts = tuple(namespace.split("/"))
    if any(not part for part in parts):
        raise InvalidArgument(f"namespace {namespace!r} has an empty label (labels are separated by '/')")
    return parts


def _item_dict(tenant: str | None, item: Item) -> dict[str, Any]:
    return {"tenant": item.tenant or tenant, "namespace": list(item.namespace), "key": item.key,
            "value": item.value, "metadata": item.metadata, "index_text": item.index_text,
            "version": item.version,
            "created_at": item.created_at, "updated_at": item.updated_at, "expires_at": item.expires_at,
            "run_id": item.run_id, "position": item.position, "operation_id": item.operation_id,
            "actor": item.actor}


def _message_dict(message: Message) -> dict[str, Any]:
    return {"index": message.index, "kind": message.kind, "value": message.value,
            "created_at": message.created_at, "run_id": message.run_id, "position": message.position,
            "operation_id": message.operation_id, "actor": message.actor}


def _preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def _origin(run_id: str | None, position: int | None, actor: str | None) -> str:
    if run_id is not None:
        return f"run {run_id} @{position}"
    return f"by {actor}" if actor else "-"


def _common(fn: Any) -> Any:
    options: list[Any] = [
        click.option("--tenant", default=None, help="The tenant (ls: default every tenant; else 'default')."),
        click.option("--namespace", default=None, metavar="A/B/C", help="Namespace labels separated by '/'."),
        click.option("--label", "labels", multiple=True, help="One namespace label, verbatim (repeatable)."),
        click.option("--json", "as_json", is_flag=True, help="JSON output."),
        app_option(required=False), db_option, click.pass_context,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.group("memory")
def memory() -> None:
    """Run, thread and long-term memory: list, read, search, delete."""


@memory.command("ls")
@_common
@click.option("--thread", "thread_id", default=None, help="List the messages of this thread.")
@click.option("--run", "run_id", default=None, help="List this run's memory and the items it wrote.")
@click.option("--limit", default=100, show_default=True, help="At most this many rows.")
def ls(ctx: click.Context, tenant: str | None, namespace: str | None, labels: tuple[str, ...], as_json: bool,
       app_spec: str | None, db: str | None, thread_id: str | None, run_id: str | None, limit: int) -> None:
    """Long-term items under a namespace prefix (default: all), a thread's
    messages (--thread), or what a run holds and wrote (--run)."""
    prefix = _namespace(namespace, labels) or ()
    if thread_id is not None and run_id is not None:
        raise InvalidArgument("list a thread or a run, not both")
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        op = session.operator
        if thread_id is not None:
            messages = op.thread_messages(tenant or "default", thread_id, limit=limit)
            if as_json:
                echo_json([_message_dict(m) for m in messages], indent=2)
            for m in [] if as_json else messages:
                origin = _origin(m.run_id, m.position, m.actor)
                echo(f"{m.index:>5}  {m.kind:<8} {origin:<24} {_preview(m.value)}")
            if not as_json and not messages:
                echo(f"thread {thread_id!r} of tenant {tenant or 'default'!r} has no messages", err=True)
            return
        scratch = op.run_memory(run_id) if run_id is not None else {}
        items = op.memory_items(tenant, prefix, run_id=run_id, limit=limit)
    if as_json:
        rows = [_item_dict(tenant, item) for item in items]
        echo_json({"run_memory": scratch, "items": rows} if run_id is not None else rows, indent=2)
        return
    for key, value in scratch.items():
        echo(f"run {run_id}  {key}  {_preview(value)}")
    for item in items:
        where = "/".join(item.namespace)
        echo(f"{where}  {item.key}  v{item.version}  {_origin(item.run_id, item.position, item.actor)}  "
             f"{_preview(item.value)}")
    if not items and not scratch:
        echo("no memory" + (f" under {'/'.join(prefix)!r}" if prefix else ""), err=True)


@memory.command("get")
@_common
@click.argument("key")
def get(ctx: click.Context, tenant: str | None, namespace: str | None, labels: tuple[str, ...], as_json: bool,
        app_spec: str | None, db: str | None, key: str) -> None:
    """One long-term item, with its provenance."""
    labels_of = _namespace(namespace, labels)
    if not labels_of:
        raise InvalidArgument("get needs the item's namespace (--namespace a/b or --label)")
    who = tenant or "default"
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        item = session.operator.memory_item(who, labels_of, key)
    if item is None:
        raise InvalidArgument(f"no item {key!r} in namespace {'/'.join(labels_of)!r} of tenant {who!r}")
    if as_json:
        echo_json(_item_dict(who, item), indent=2)
        return
    for name, value in _item_dict(who, item).items():
        echo(f"{name:<13} {json.dumps(value, ensure_ascii=False, sort_keys=True)}")


@memory.command("search")
@_common
@click.argument("query")
@click.option("-k", "k", default=10, show_default=True, help="How many hits.")
def search(ctx: click.Context, tenant: str | None, namespace: str | None, labels: tuple[str, ...],
           as_json: bool, app_spec: str | None, db: str | None, query: str, k: int) -> None:
    """The items nearest to QUERY (the --app's embedder), and how many are not indexed yet."""
    prefix = _namespace(namespace, labels) or ()
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        result = session.operator.search_memory(tenant or "default", prefix, query, k=k)
    if as_json:
        echo_json({"hits": [{"score": h.score, **_item_dict(tenant, h.item)} for h in result.hits],
                   "unindexed": result.unindexed}, indent=2)
        return
    for hit in result.hits:
        echo(f"{hit.score:.4f}  {'/'.join(hit.item.namespace)}  {hit.item.key}  {_preview(hit.item.value)}")
    if result.unindexed:
        echo(f"{result.unindexed} item(s) in scope are not indexed yet", err=True)


@memory.command("rm")
@_common
@click.argument("key", required=False)
@click.option("--thread", "thread_id", default=None, help="Delete this thread.")
@click.option("--run", "run_id", default=None, help="Delete everything this run wrote.")
@click.option("--all", "everything", is_flag=True, help="Delete all of the tenant's memory.")
def rm(ctx: click.Context, tenant: str | None, namespace: str | None, labels: tuple[str, ...], as_json: bool,
       app_spec: str | None, db: str | None, key: str | None, thread_id: str | None, run_id: str | None,
       everything: bool) -> None:
    """Delete one item (namespace + KEY), a namespace prefix, a thread, what a
    run wrote, or with --all every memory of --tenant; their outbox rows and
    vectors go too, offloaded values at the next prune."""
    prefix = _namespace(namespace, labels)
    scopes = (("--namespace", prefix is not None), ("--thread", thread_id is not None),
              ("--run", run_id is not None), ("--all", everything))
    chosen = [name for name, given in scopes if given]
    if len(chosen) != 1:
        raise InvalidArgument("rm deletes by exactly one of --namespace, --thread, --run, --all"
                              + (f" (got {' and '.join(chosen)})" if chosen else ""))
    if key is not None and prefix is None:
        raise InvalidArgument("rm KEY needs the item's namespace (--namespace)")
    if everything and tenant is None:
        raise InvalidArgument("rm --all needs --tenant (one tenant at a time)")
    who = tenant if tenant is not None or run_id is not None else "default"
    with open_session(db_from_context(ctx, db), app_spec) as session:
        deleted = session.operator.delete_memory(who, namespace=prefix, key=key, thread_id=thread_id,
                                                 run_id=run_id)
    if as_json:
        echo_json({"deleted": deleted})
    else:
        echo(f"deleted {deleted} memory row{'s' if deleted != 1 else ''}")


@memory.command("tiers")
@click.option("--tenant", default=None, help="One tenant's memory (default: every tenant).")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@app_option(required=False)
@db_option
@click.pass_context
def tiers(ctx: click.Context, tenant: str | None, as_json: bool, app_spec: str | None,
          db: str | None) -> None:
    """Long-term memory per tier: the vectors and their bytes (hot: float32,
    searched as stored; cold: int8, a quarter of the bytes), and the items
    and the bytes of their values (hot: inline in the row; cold: compressed
    out of it, with the bytes they restore to)."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        vectors = {t.tier: t for t in session.operator.memory_tiers(tenant)}
        items = {t.tier: t for t in session.operator.memory_item_tiers(tenant)}
    report: dict[str, dict[str, int]] = {}
    for tier in ("hot", "cold"):
        v, i = vectors.get(tier), items.get(tier)
        report[tier] = {"vectors": v.vectors if v else 0, "bytes": v.bytes if v else 0,
                        "items": i.items if i else 0, "item_bytes": i.bytes if i else 0,
                        "item_raw_bytes": i.raw_bytes if i else 0}
    if as_json:
        echo_json(report, indent=2)
        return
    for tier, f in report.items():
        echo(f"{tier:<5} {f['vectors']:>9} vectors {f['bytes']:>12} bytes {f['items']:>9} items "
             f"{f['item_bytes']:>12} bytes ({f['item_raw_bytes']} raw)")


@memory.command("tier")
@click.option("--idle", type=float, default=None,
              help="Seconds unread and unwritten before a value goes cold (default: the app's cold_after).")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@app_option(required=False)
@db_option
@click.pass_context
def tier(ctx: click.Context, idle: float | None, as_json: bool, app_spec: str | None, db: str | None) -> None:
    """Run a tiering pass of item values now (cairn worker runs one every
    minute with MemoryPolicy(cold_after=...)): idle values go cold, values
    touched since come back hot."""
    if idle is not None and not idle > 0:
        raise InvalidArgument(f"--idle must be a positive number of seconds, not {idle:g}")
    with open_session(db_from_context(ctx, db), app_spec) as session:
        moved = session.operator.tier_memory(idle)
    if as_json:
        echo_json({"cooled": moved.cooled, "rewarmed": moved.rewarmed})
    else:
        echo(f"{moved.cooled} item values cooled, {moved.rewarmed} back hot")
