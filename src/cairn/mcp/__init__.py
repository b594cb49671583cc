"""MCP servers' tools as journaled Cairn tools (the ``mcp`` extra): see
``cairn.mcp.server``."""

from cairn.errors import MissingExtra

try:
    import mcp  # noqa: F401
except ImportError as exc:
    raise MissingExtra("cairn.mcp", "mcp") from exc

from cairn.mcp.connection import MCPUnavailable
from cairn.mcp.server import Access, Egress, EgressRefused, MCPServer, MCPToolError, ToolRefused

__all__ = ["Access", "Egress", "EgressRefused", "MCPServer", "MCPToolError", "MCPUnavailable", "ToolRefused"]
