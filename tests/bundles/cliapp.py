"""The app ``cairn ... --app tests.bundles.cliapp:app`` loads: both versions
of ``order`` on ``$CAIRN_DB``."""

from tests.bundles.apps import serving_both

app = serving_both(None)
