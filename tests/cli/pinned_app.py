"""An app that names its database in code, so ``--db`` cannot move it."""

import cairn
from tests.cli.workflows import register

app = cairn.App("memory://")
register(app)
not_an_app = register
