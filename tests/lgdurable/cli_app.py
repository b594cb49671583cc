"""The support graph on a module-level App (``$CAIRN_DB``), for the command
line tests: ``cairn start support --app tests.lgdurable.cli_app:app``."""

from __future__ import annotations

import cairn
from tests.lgdurable.support import register

app = cairn.App()
support = register(app)
