"""The ``cairn`` command: run workers, start runs, inspect and operate on them.

Every command takes ``--db URL`` (also accepted before the command name).
Errors a user can cause print one line, ``error: ...``, and exit 2 for usage
mistakes or 1 for everything else; a traceback always means a bug in Cairn.

This module is the entry point (``cairn = "cairn.cli.main:main"``) and only
assembles the group: each topic's commands live in a module of their own
(``worker.py``, ``runs.py``, ``inspection.py``, ``ops.py``, ``database.py``,
``approvals.py``, ...), as ``click`` commands that ``main`` adds.
"""

from __future__ import annotations

import click

from .approvals import approvals, approve, reject
from .archive import archive
from .audit import audit
from .bundles import COMMANDS as BUNDLE_COMMANDS
from .database import db_group, parse_duration, prune
from .demos import _payments_demo, demo
from .erasure import erase
from .graph import graph
from .inspection import events, runs, show
from .keys import keys
from .langgraph import langgraph
from .mcp import mcp
from .memory import memory
from .ops import ops
from .options import CairnGroup, db_option
from .queues import queues
from .retention import retention
from .runs import budget, cancel, kill, resume, retry, start
from .sandbox import sandbox
from .schedules import schedules
from .serve import serve
from .signals import signal as signal_command
from .signals import wait as wait_command
from .tokens import tokens
from .watch import watch
from .worker import _outcome_logger, worker
from .workspace import workspace

#: importable from here as they always were (tests and scripts use them)
__all__ = ["_outcome_logger", "_payments_demo", "main", "parse_duration"]


@click.group(cls=CairnGroup, context_settings={"help_option_names": ["-h", "--help"]})
@db_option
@click.version_option(package_name="cairn", prog_name="cairn")
def main(db: str | None) -> None:
    """Cairn: a durable runtime for long-running AI agents."""


for _command in (
    demo, worker, start,                                        # running: demos, workers, starting runs
    runs, show, events,                                         # inspection (cli/inspection.py)
    cancel, retry, kill, resume, budget, ops,                   # operator actions (cli/runs.py, cli/ops.py)
    db_group, prune,                                            # the database (cli/database.py)
    queues, memory, signal_command, wait_command,
    approvals, approve, reject,                                 # approvals (cli/approvals.py)
    serve, tokens, watch,                                       # the HTTP API (cairn.server)
    mcp,                                                        # cairn mcp serve (cairn.mcpserve)
    schedules, *BUNDLE_COMMANDS,                                # schedules; bundles, replay checks, migration
    graph,                                                      # graph runs' time travel (cli/graph.py)
    langgraph,                                                  # LangGraph threads' time travel
    keys,                                                       # encryption keys (cli/keys.py)
    workspace,                                                  # runs' workspaces (cli/workspace.py)
    sandbox,                                                    # cairn sandbox check (cli/sandbox.py)
    audit,                                                      # the audit chain (cli/audit.py)
    erase,                                                      # erasure by subject/thread/tenant
    archive,                                                    # archived runs (cli/archive.py)
    retention,                                                  # retention policies (cli/retention.py)
):
    main.add_command(_command)
