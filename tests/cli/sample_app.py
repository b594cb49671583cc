"""The app the CLI tests load with ``--app tests.cli.sample_app:app``.

Built with ``cairn.App()`` at import time, like user code: the database comes
from ``$CAIRN_DB``, which the CLI sets from ``--db`` before importing.
"""

import cairn
from tests.cli.workflows import register

app = cairn.App()
register(app)
