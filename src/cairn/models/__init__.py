"""Model clients: the provider-neutral types and errors, a scripted offline
model, and an OpenAI-compatible chat-completions adapter (``cairn.models.openai``,
the ``openai`` extra; not imported here, so a plain install imports this)."""

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
from cairn.models.errors import ModelRequestError, ModelUnavailable
from cairn.models.scripted import ScriptedModel
from cairn.models.window import ContextOverflow, ContextPolicy

__all__ = [
    "ContextOverflow",
    "ContextPolicy",
    "FunctionCall",
    "Message",
    "ModelClient",
    "ModelRecord",
    "ModelRequest",
    "ModelRequestError",
    "ModelResponse",
    "ModelUnavailable",
    "ScriptedModel",
    "ToolCall",
    "Usage",
]
