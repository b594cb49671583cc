"""Answers in Anthropic's Messages API wire format, for the fake HTTP server
of ``fake_openai`` (a real server on 127.0.0.1 that records each request and
answers from a script: the path and the body shapes are all that differ)."""

from __future__ import annotations

from typing import Any

from tests.models.fake_openai import Reply, json_reply


def message(
    *blocks: dict[str, Any],
    model: str = "claude-fake-2025",
    stop_reason: str = "end_turn",
    usage: dict[str, int] | None = None,
    **extra: Any,
) -> Reply:
    """A successful ``message`` answer with ``blocks`` (default: one text block)."""
    body: dict[str, Any] = {
        "id": "msg_01", "type": "message", "role": "assistant", "model": model,
        "content": list(blocks) if blocks else [text("hello")],
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": usage if usage is not None else {"input_tokens": 10, "output_tokens": 2},
        **extra,
    }
    return json_reply(body)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def error(status: int, kind: str, text_: str, **headers: str) -> Reply:
    """An Anthropic error body (``{"type": "error", "error": {...}}``)."""
    return json_reply({"type": "error", "error": {"type": kind, "message": text_}}, status, headers)
