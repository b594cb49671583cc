"""The tool policy of a workflow's own code is in its bundle: an MCP
server's access rules and effect overrides (``MCPServer(access=...,
effects=...)``) and a context policy (``ContextPolicy``) declared at module
level are values the workflow reads, so they are in its code hash; changing
one is a new bundle, and runs started before keep theirs (a worker whose
policy differs refuses them: code drift)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from cairn.engine.bundles import code_hash
from tests.bundles.test_codehash import _write, packages  # noqa: F401 - the fixture

pytest.importorskip("mcp", reason="the mcp extra")

FLOWS = '''
    import cairn
    from cairn.mcp import Egress, MCPServer, ToolAccess
    from cairn.models import ContextPolicy

    FILES = MCPServer("files", command=["/usr/bin/true"], egress=Egress(commands=["/usr/bin/true"]),
                      effects={"archive": "write"},
                      access={"delete": ToolAccess(role="admin")})
    CONTEXT = ContextPolicy(window=16000, keep_last=6)


    def agent(ctx, model, messages):
        ctx.model(model, messages, context=CONTEXT)
        return FILES.call("delete", {"path": "/tmp/x"})


    def agent_with_default(ctx, model, messages, context=ContextPolicy(window=8000)):
        return ctx.model(model, messages, context=context)
'''

_made = iter(range(1_000_000))


def _agent(root: Path, old: str = "", new: str = "", name: str = "agent") -> Any:
    package = f"variant_policy_{next(_made)}"
    assert old in FLOWS
    _write(root, package, {"flows.py": FLOWS.replace(old, new)})
    importlib.invalidate_caches()
    return getattr(importlib.import_module(f"{package}.flows"), name)


@pytest.mark.parametrize(("what", "old", "new"), [
    ("an MCP tool's access role", 'ToolAccess(role="admin")', 'ToolAccess(role="viewer")'),
    ("an MCP tool's allowed tenants", 'ToolAccess(role="admin")',
     'ToolAccess(role="admin", tenants=frozenset({"acme"}))'),
    ("an MCP tool's effect override", '{"archive": "write"}', '{"archive": "read"}'),
    ("the context policy's window", "window=16000", "window=32000"),
    ("what the context policy keeps", "keep_last=6", "keep_last=2"),
])
def test_a_policy_change_changes_the_code_hash(
    packages: Path, what: str, old: str, new: str  # noqa: F811 - the fixture
) -> None:
    assert code_hash(_agent(packages)) == code_hash(_agent(packages)), "stable"
    assert code_hash(_agent(packages, old, new)) != code_hash(_agent(packages)), what


def test_a_policy_held_as_a_default_is_pinned_too(packages: Path) -> None:  # noqa: F811 - the fixture
    """Not a module-level binding (whose statement the hash would read):
    the policy's own settings are what counts."""
    base = code_hash(_agent(packages, name="agent_with_default"))
    assert code_hash(_agent(packages, name="agent_with_default")) == base
    assert code_hash(_agent(packages, "window=8000", "window=9000", name="agent_with_default")) != base
