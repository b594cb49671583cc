"""Workflows for the CLI tests, registered on whichever App a test builds.

They live apart from ``sample_app`` (which builds its App at import time, the
way user code does) so a test can build its own App on its own database and
execute runs the CLI started, without importing ``sample_app`` itself.
"""

from __future__ import annotations

import time
from pathlib import Path

import cairn


def register(app: cairn.App) -> None:
    @app.step(name="shout")
    def shout(text: str) -> str:
        return text.upper()

    @app.workflow(name="greet")
    def greet(ctx: cairn.Context, name: str, punctuation: str = "!") -> dict[str, str]:
        return {"greeting": shout(f"hello {name}") + punctuation, "tenant": ctx.tenant}

    @app.step(name="check_flag")
    def check_flag(flag: str) -> str:
        if not Path(flag).exists():
            raise RuntimeError(f"flag file {flag} is missing")
        return "flag found"

    @app.workflow(name="flaky")
    def flaky(ctx: cairn.Context, flag: str) -> str:
        shout("before the flag")
        return check_flag(flag)

    @app.step(name="tick")
    def tick(i: int, seconds: float) -> int:
        time.sleep(seconds)
        return i

    @app.workflow(name="slow")
    def slow(ctx: cairn.Context, n: int = 3, seconds: float = 0.5) -> list[int]:
        return [tick(i, seconds) for i in range(n)]

    @app.workflow(name="big")
    def big(ctx: cairn.Context, size: int) -> str:
        return shout("x" * size)


def build_app(db: str, inline_limit: int = 256 * 1024) -> cairn.App:
    app = cairn.App(db, inline_limit=inline_limit, lease_seconds=5.0)
    register(app)
    return app
