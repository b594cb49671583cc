"""The app the schedule crash tests run in worker processes: two schedules
of one workflow, every second, one per missed-tick policy.

``build_app`` reads the store URL from ``CAIRN_TEST_DB`` when not given, so
the test process and the worker subprocesses share one store. ``GRACE`` is
short so that an outage of a few seconds is a real outage for the policies.
"""

from __future__ import annotations

import os
from datetime import datetime

import cairn

DB_ENV = "CAIRN_TEST_DB"
GRACE = 2.0
TENANT = "acme"
#: schedule name -> missed-tick policy
SCHEDULES = {"beat-skip": "skip", "beat-once": "once"}


def build_app(db: str | None = None, *, lease_seconds: float = 1.0) -> cairn.App:
    app = cairn.App(db or os.environ[DB_ENV], lease_seconds=lease_seconds)

    @app.workflow(name="beat")
    def beat(ctx: cairn.Context, label: str, at: datetime) -> str:
        return f"{label} {at.isoformat()}"

    for name, missed in SCHEDULES.items():
        app.schedule("* * * * * *", beat, name=name, tenant=TENANT, kwargs={"label": name}, tick_arg="at",
                     missed=missed, grace=GRACE)
    return app
