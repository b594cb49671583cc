"""App modules as deployments: ``APP_MODULES[name]`` builds the app a worker
process of that deployment runs (``run_worker``), on ``$CAIRN_DB``."""

from __future__ import annotations

from collections.abc import Callable

import cairn
from tests.bundles import flows


def _app(db: str | None, prompt: str = "hello") -> cairn.App:
    app = cairn.App(db=db, lease_seconds=1.0)
    app.prompt("greeting", prompt)
    return app


def serving_v1(db: str | None = None) -> cairn.App:
    app = _app(db)
    app.workflow(name="order", version="1")(flows.order_v1)
    return app


def serving_v2(db: str | None = None) -> cairn.App:
    app = _app(db)
    app.workflow(name="order", version="2")(flows.order_v2)
    return app


def serving_both(db: str | None = None) -> cairn.App:
    app = _app(db)
    app.workflow(name="order", version="1")(flows.order_v1)
    app.workflow(name="order", version="2")(flows.order_v2)
    return app


def drifted_v1(db: str | None = None) -> cairn.App:
    """Version 1 under the same name and version, with other code."""
    app = _app(db)
    app.workflow(name="order", version="1")(flows.order_v1_drifted)
    return app


APP_MODULES: dict[str, Callable[[str | None], cairn.App]] = {
    "v1": serving_v1, "v2": serving_v2, "both": serving_both, "drifted": drifted_v1,
}
