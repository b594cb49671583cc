"""``python -m tests.security.cli_worker --worker-id X ARGS`` runs ``cairn
worker --worker-id X ARGS``: the real command line worker, launched by the
crash harness (which puts ``--worker-id`` right after the module)."""

from __future__ import annotations

import sys

from cairn.cli.main import main

if __name__ == "__main__":
    main(["worker", *sys.argv[1:]], prog_name="cairn")
