"""``--app tests.cli.graph_app:app``: the graph of ``graph_flows`` on
``$CAIRN_DB`` (the time-travel commands' tests, ``test_graph_cli.py``)."""

import cairn
from tests.cli.graph_flows import register

app = cairn.App()
register(app)
