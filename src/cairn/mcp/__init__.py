"""MCP servers' tools as journaled Cairn tools (the ``mcp`` extra): see
``cairn.mcp.server``."""

from cairn.errors import MissingExtra

try:
    import mcp  # noqa: F401
except ImportError as exc:
    raise MissingExtra("cairn.mcp", "mcp") from exc

from cairn.mcp.connection import MCPUnavailable
from cairn.mcp.server import Egress, EgressRefused, MCPServer, MCPToolError, ToolAccess, ToolRefused

__all__ = ["Egress", "EgressRefused", "MCPServer", "MCPToolError", "MCPUnavailable", "ToolAccess",
           "ToolRefused"]
