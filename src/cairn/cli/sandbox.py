"""``cairn sandbox check``: which of the sandbox's controls this host
provides (``cairn.sandbox.controls``), one line each; exit status 1 when
any is missing, since a sandbox then refuses to start unless its policy
allows running without that control (``allow_degraded``)."""

from __future__ import annotations

import click

from .terminal import echo, echo_json


@click.group("sandbox")
def sandbox() -> None:
    """Sandboxed execution of untrusted code (cairn.sandbox)."""


@sandbox.command("check")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
def check(as_json: bool) -> None:
    """Print which sandbox controls this host provides."""
    from cairn.sandbox.controls import check as controls

    found = controls()
    if as_json:
        echo_json([{"name": c.name, "available": c.available, "detail": c.detail} for c in found], indent=2)
    else:
        for c in found:
            echo(f"{'ok' if c.available else 'MISSING':<8} {c.name:<11} {c.detail}")
    if not all(c.available for c in found):
        raise SystemExit(1)
