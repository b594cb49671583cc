"""``cairn demo``, ``cairn demo payments``, ``cairn demo approval``: the
commands that start the offline demos (the demos themselves are
``cli/demo.py`` and ``cairn.demo``, imported only when a demo runs, so that
``cairn --help`` stays fast)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import click
from rich.console import Console

from cairn.store import sqlite_path

from .options import db_from_context as _db
from .options import db_option


@click.group(invoke_without_command=True)
@db_option
@click.option("--steps", type=click.IntRange(10, 20), default=None,
              help="Step budget of the demo agent (it reads (STEPS - 8) / 2 files). Default: 20.")
@click.pass_context
def demo(ctx: click.Context, db: str | None, steps: int | None) -> None:
    """Kill a worker in the middle of an agent run and watch another finish it.

    Starts the offline demo agent, SIGKILLs its worker after about 40% of the
    steps, starts a second worker, and checks from an effects log that no
    finished step ran twice. 'cairn demo payments' runs the exactly-once
    payments demo instead; 'cairn demo approval' the approval demo.
    """
    if ctx.invoked_subcommand is not None:
        if steps is not None:
            raise click.UsageError(f"--steps only applies to the research-agent demo ('cairn demo'), not "
                                   f"'cairn demo {ctx.invoked_subcommand}'")
        return
    from .demo import run_demo  # keeps `cairn --help` fast

    ctx.exit(run_demo(_db(ctx, db), 20 if steps is None else steps, Console(highlight=False, soft_wrap=True)))


@demo.command("payments")
@db_option
@click.pass_context
def demo_payments(ctx: click.Context, db: str | None) -> None:
    """Kill a worker between the bank moving money and Cairn recording it;
    check that the bank holds exactly one transfer per refund."""
    db = _db(ctx, db)
    if db is not None and sqlite_path(db) is None:
        raise click.UsageError(f"the payments demo needs a SQLite database file that its worker processes "
                               f"can share, not {db!r}")
    run_payments_demo = _payments_demo()
    ctx.exit(run_payments_demo(db, Console(highlight=False, soft_wrap=True)))


@demo.command("approval")
@db_option
@click.pass_context
def demo_approval(ctx: click.Context, db: str | None) -> None:
    """A refund that waits for a person: the waiting run holds no worker, a
    worker killed during the wait loses nothing, and the edited amount is
    paid exactly once."""
    db = _db(ctx, db)
    if db is not None and sqlite_path(db) is None:
        raise click.UsageError(f"the approval demo needs a SQLite database file that its worker processes "
                               f"can share, not {db!r}")
    previous = os.environ.get("CAIRN_DB")
    if "cairn.demo.approval" not in sys.modules:
        os.environ["CAIRN_DB"] = "memory://"  # its module-level App must not create a database here
    try:
        from cairn.demo.approval import run_approval_demo
    finally:
        if previous is None:
            os.environ.pop("CAIRN_DB", None)
        else:
            os.environ["CAIRN_DB"] = previous
    ctx.exit(run_approval_demo(db, Console(highlight=False, soft_wrap=True)))


def _payments_demo() -> Callable[[str | None, Console], int]:
    """``cairn.demo.payments.run_payments_demo``, imported without side effects.

    The module builds a ``cairn.App()`` at import time (for its workers, which
    get ``--db``); here that App is never used, so it is pointed at a
    throwaway in-memory store instead of creating ``$CAIRN_DB`` or the default
    database file as a side effect of importing.
    """
    previous = os.environ.get("CAIRN_DB")
    if "cairn.demo.payments" not in sys.modules:
        os.environ["CAIRN_DB"] = "memory://"
    try:
        payments = importlib.import_module("cairn.demo.payments")
    except ImportError as exc:
        raise click.ClickException(f"the payments demo is not installed ({exc})") from None
    finally:
        if previous is None:
            os.environ.pop("CAIRN_DB", None)
        else:
            os.environ["CAIRN_DB"] = previous
    run: Callable[[str | None, Console], int] | None = getattr(payments, "run_payments_demo", None)
    if run is None:
        raise click.ClickException("the payments demo is not installed")
    return run


