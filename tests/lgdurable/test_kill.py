"""SIGKILL the workers of a LangGraph agent at random points, many times (both backends).

The agent (``agent_app``: a parallel fan-out with ``Send``, a node running a
subgraph, a conditional loop, and a ``write`` tool paying into a bank file)
runs under real ``cairn worker``-style processes, each killed without
warning at a random moment after a node started, until one is left to
finish. Then the run is completed with no recovery code of the user's, each
payment happened exactly once in the bank, and the final state is the one
an uninterrupted run of the same graph produces."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cairn.lgdictionary import KIND as DICTIONARY
from cairn.lgdictionary import MARK
from cairn.lgdurable import KIND
from cairn.store.records import RunStatus
from tests import processes
from tests.backends import PostgresBackend, StoreBackend
from tests.langgraph.rawsql import raw_sql
from tests.lgdurable import agent_app

#: where the run stops for good: finished, or waiting for an operator (an unresolved effect)
SETTLED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION)


#: the root graph's nodes (``audit``'s subgraph runs inside ``audit``'s step)
GRAPH_NODES = {"plan", "pay", "audit", "decide"}


def dictionary_compressed(backend: StoreBackend) -> int:
    """How many stored LangGraph values are compressed with a thread's own dictionary."""
    query = "SELECT data FROM lg_values WHERE coalesce(kind, '') <> ?"
    if isinstance(backend, PostgresBackend):
        with backend.connect() as conn:
            rows = conn.execute(query.replace("?", "%s"), (DICTIONARY,)).fetchall()
    else:
        rows = raw_sql(backend.url, query, (DICTIONARY,))
    return sum(bytes(data)[:1] == MARK for (data,) in rows)


def journal_names(app: Any) -> list[str]:
    """The names of the run's LangGraph steps, in the journal's order."""
    return [str(e.name) for e in app.history("agent") if e.step_kind == KIND]


def nodes_named(name: str) -> list[str]:
    """The nodes a step's name lists (``step 3: audit, pay``), none for a step no node ran in."""
    head, colon, nodes = name.partition(": ")
    assert head.startswith("step "), name
    return nodes.split(", ") if colon else []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkilled_langgraph_workers_resume_with_each_payment_once(tmp_path: Path,
                                                                   backend: StoreBackend) -> None:
    app, workflow = agent_app.build(backend.url, tmp_path)
    app.start(workflow, agent_app.START_STATE, run_id="agent")
    rnd = random.Random()
    workers: list[processes.Forked] = []
    kills = 0
    # every worker is forked from one that imported the agent (LangGraph) once
    zygote = processes.Zygote("tests.lgdurable.agent_app", log=tmp_path / "zygote.log",
                              preload=agent_app.PRELOAD)
    try:
        for round_ in range(60):
            worker = zygote.spawn(["--worker-id", f"w{round_}"],
                                  env={"CAIRN_TEST_DB": backend.worker_url(f"w{round_}"),
                                       "CAIRN_TEST_DIR": str(tmp_path)}, log=tmp_path / f"w{round_}.log")
            workers.append(worker)
            noted = tmp_path / "executions.jsonl"
            seen = len(agent_app.lines(noted))
            deadline = time.monotonic() + 120
            if round_ < 12:  # kill it once a node has started, at a random moment after
                while time.monotonic() < deadline and len(agent_app.lines(noted)) == seen \
                        and app.get_run("agent").status not in SETTLED:
                    time.sleep(0.005)
                time.sleep(rnd.uniform(0, 0.12))
                kills += 1
            else:  # the last one finishes the run
                while time.monotonic() < deadline and app.get_run("agent").status not in SETTLED:
                    time.sleep(0.02)
            worker.kill()
            worker.wait(10)
            if app.get_run("agent").status in SETTLED:
                break
        run = app.get_run("agent")
        assert run.status is RunStatus.COMPLETED, f"{run.status.value} after {kills} kills: {run.error}"
        paid = Counter(e["what"] for e in agent_app.lines(tmp_path / "bank.jsonl"))
        assert paid == Counter(agent_app.PAYMENTS), paid  # each payment happened once (each fee twice)
        # the journal names the nodes each attempt ran: a super-step cut by a kill after some of its
        # tasks stored their writes is named, on resume, for the tasks that were left
        named = {node for name in journal_names(app) for node in nodes_named(name)}
        assert named, named
        assert named <= GRAPH_NODES, named
        final = app.handle("agent").result()
        executions = agent_app.lines(tmp_path / "executions.jsonl")
        # the run's long values went through a thread dictionary some worker made
        assert dictionary_compressed(backend) > 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        zygote.close()
        app.close()

    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    clean, clean_workflow = agent_app.build(f"sqlite:///{clean_dir}/cairn.db", clean_dir)
    try:
        assert final == clean.run(clean_workflow, agent_app.START_STATE, run_id="agent")
        # uninterrupted, each super-step is named for all of its nodes, parallel ones in one name
        names = journal_names(clean)
        assert "step 1: plan" in names, names
        assert any(nodes_named(name) == ["audit", "pay"] for name in names), names
        uninterrupted = len(agent_app.lines(clean_dir / "executions.jsonl"))
    finally:
        clean.close()
    print(f"{len(workers)} workers ({kills} killed), {len(executions) - uninterrupted} node executions "
          "run again")
