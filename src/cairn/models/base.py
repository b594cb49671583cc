"""What a model call is, independent of any provider.

Requests and responses are msgspec Structs so they are recorded in the
journal exactly as sent and received, and decoded back into the same types on
replay. The shapes follow the OpenAI chat-completions format, the de facto
lingua franca of compatible servers.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec


class ToolCall(msgspec.Struct, frozen=True, omit_defaults=True):
    """A tool the model asked to call, with JSON-encoded arguments.

    ``type`` is ``"function"`` for function tools; for a ``"custom"`` tool
    (free-form input) ``arguments`` holds the model's raw input, not JSON.
    """

    id: str
    name: str
    arguments: str
    type: str = "function"

    def parsed_arguments(self) -> Any:
        return msgspec.json.decode(self.arguments)


#: One part of a multimodal message, as the chat-completions format spells it:
#: ``{"type": "text", "text": ...}``, ``{"type": "image_url", "image_url":
#: {"url": ...}}``, ``{"type": "input_audio", ...}``... Kept as plain JSON so
#: that every part type a server accepts is sent and journaled unchanged.
ContentPart = dict[str, Any]


class FunctionCall(msgspec.Struct, frozen=True):
    """The legacy (pre-``tools``) ``function_call`` of an assistant message."""

    name: str
    arguments: str


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """One chat message. ``content`` is text, or a sequence of parts for
    multimodal input (text with images, audio, files). ``refusal`` is the
    model's refusal text, when it declined to answer; ``function_call`` the
    legacy single function call."""

    role: str
    content: str | tuple[ContentPart, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    refusal: str | None = None
    function_call: FunctionCall | None = None

    @property
    def text(self) -> str:
        """The message's text: its content, or its text parts joined."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Tokens a call used. ``prompt_tokens`` counts every input token the
    model read, cached or not (so a budget sees them all); the cache fields
    say how many of them were read from (``cache_read_tokens``) or written
    to (``cache_write_tokens``) the provider's prompt cache, where it says.
    Zero fields are left out of the journal."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class ModelRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """Everything sent to the model. The journal holds each message once per
    run and rebuilds the request exactly (``cairn.engine.modelcalls``)."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    params: dict[str, Any] = msgspec.field(default_factory=dict)


class ModelResponse(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the model answered, plus what it cost. ``provider``: what the
    provider returned beside the message that must be kept as it came
    (Anthropic's ``context_management``: the context edits it applied)."""

    message: Message
    model: str
    usage: Usage = Usage()
    finish_reason: str | None = None
    cost: float | None = None
    provider: dict[str, Any] | None = None


class ModelRecord(msgspec.Struct, frozen=True):
    """One model call as sent and received, as ``engine.modelcalls.records``
    rebuilds it from the journal (and the journal payload of calls recorded
    before messages were stored once per run)."""

    request: ModelRequest
    response: ModelResponse
    latency_ms: float


@runtime_checkable
class ModelClient(Protocol):
    """A chat model. ``model_id`` names it in the journal (and a replay with
    a different model id at the same position is a non-determinism error)."""

    model_id: str

    def complete(self, request: ModelRequest) -> ModelResponse: ...
