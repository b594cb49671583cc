"""The app the ``cairn schedules`` tests load with ``--app``.

Built at import time like user code (the database from ``$CAIRN_DB``, set by
the CLI from ``--db``). ``CAIRN_TEST_BAD_SCHEDULE`` makes one declaration bad
(``cron``, ``zone``, ``workflow``, ``kwargs``, ``tick_arg``, ``missed``,
``twice``), for the bad-input tests: importing the module then fails at the
declaration, as it would in a user's module. ``CAIRN_TEST_FAST_SCHEDULE``
adds one every second, for the worker tests.
"""

import os
from datetime import datetime

import cairn

app = cairn.App()


@app.schedule("0 8 * * 1-5", name="morning-report", tenant="acme", timezone="Europe/Paris",
              kwargs={"topic": "sales"}, tick_arg="at")
@app.workflow(name="report")
def report(ctx: cairn.Context, topic: str, at: datetime) -> str:
    return f"{topic} at {at.isoformat()}"


app.schedule("*/15 * * * *", report, name="[red]x\x1b[2J", tenant="acme", kwargs={"topic": "markup"},
             tick_arg="at", missed="skip")

if os.environ.get("CAIRN_TEST_FAST_SCHEDULE"):
    app.schedule("* * * * * *", report, name="every-second", tenant="acme", kwargs={"topic": "fast"},
                 tick_arg="at")

_BAD = os.environ.get("CAIRN_TEST_BAD_SCHEDULE")
_CASES = {
    "cron": dict(cron="0 25 * * *"),
    "zone": dict(timezone="Europe/Pariss"),
    "workflow": dict(workflow="no-such-workflow"),
    "kwargs": dict(kwargs={"topik": "x"}),
    "tick_arg": dict(tick_arg="when"),
    "missed": dict(missed="sometimes"),
    "twice": dict(name="morning-report", tenant="acme"),
}
if _BAD is not None:
    options: dict = {"cron": "* * * * *", "workflow": report, "name": "bad", "kwargs": {"topic": "x"},
                     "tick_arg": "at", **_CASES[_BAD]}
    app.schedule(options.pop("cron"), options.pop("workflow"), **options)
