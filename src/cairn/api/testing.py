"""``cairn.testing.replay``: replay recorded runs in a user's test suite.

Export a run (``cairn export RUN > tests/runs/refund.json``), commit the file,
and a test fails as soon as a code change would make that run diverge::

    def test_refund_run_still_replays():
        cairn.testing.replay(app, "tests/runs/refund.json")

The check is the dry run of ``cairn replay-check`` (``engine.replaycheck``):
no database is written, no step, tool or model is called.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cairn.api.app import App
from cairn.api.export import read_export
from cairn.engine import replaycheck
from cairn.engine.replaycheck import ReplayReport
from cairn.errors import ReplayDivergence, UnknownWorkflow


def replay(app: App, path: str | Path, *, version: str | None = None) -> ReplayReport:
    """Replay the run exported in ``path`` against ``app``'s code for its
    workflow (``version``, else the run's own version if registered, else
    the newest); raise ``ReplayDivergence`` (an ``AssertionError``) naming
    the first divergence, or return the report."""
    run, history, bundle = read_export(path)
    registry = app.runtime.registry
    definition = (registry.version(run.workflow, version) if version is not None
                  else registry.version(run.workflow, run.workflow_version) or registry.newest(run.workflow))
    if definition is None:
        raise UnknownWorkflow(run.workflow if version is None else f"{run.workflow} version {version}",
                              list(app.runtime.workflows))
    if bundle is not None:
        registry.remember(bundle)  # prompts and settings as the run had them
    else:
        run = replace(run, bundle=None)
    report = replaycheck.check(app.runtime, definition, run, history)
    if not report.compatible:
        raise ReplayDivergence(f"{path}: {report.describe()}")
    return report
