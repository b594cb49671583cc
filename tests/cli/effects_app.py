"""``--app tests.cli.effects_app:app``: the effects workflows, on ``$CAIRN_DB``."""

import cairn
from tests.cli.effects import register

app = cairn.App()
register(app)
