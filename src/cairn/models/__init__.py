"""Model clients: the provider-neutral types, a scripted offline model, and
an OpenAI-compatible chat-completions adapter (``cairn.models.openai``)."""

from cairn.models.base import (
    FunctionCall,
    Message,
    ModelClient,
    ModelRecord,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from cairn.models.scripted import ScriptedModel

__all__ = [
    "FunctionCall",
    "Message",
    "ModelClient",
    "ModelRecord",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "ToolCall",
    "Usage",
]
