"""Start one run from a git repository, in a process of its own (the crash
test of ``test_git_import_crash.py`` arms ``workspace.import.after_objects``
so this process SIGKILLs itself between storing the tree and recording it).

``python -m tests.workspace.git_importer DB WORKSPACES REPO RUN_ID``. The
import's least lease (ten minutes) is set to none, so the app's own lease
(5 s) applies and the test need not wait ten minutes for a worker to meet
the run the dead import left.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cairn.api import wsimport
from tests.workspace.test_git_import import build


def main(argv: list[str]) -> int:
    db, workspaces, repo, run_id = argv
    wsimport.IMPORT_LEASE_SECONDS = 0.0
    app = build(db, Path(workspaces))
    app.start("ws-git", run_id=run_id, workspace_from=repo, workspace_ref="v1")
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
