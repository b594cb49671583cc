"""A deterministic stand-in for an LLM, for demos and tests that run offline.

A ``ScriptedModel`` answers from a policy function of the conversation so
far (or from a fixed list of replies). It counts how often it was asked,
which is how tests prove that a recovered run replayed the recorded decision
instead of asking again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from cairn.models.base import Message, ModelRequest, ModelResponse, Usage

Policy = Callable[[ModelRequest, int], Message]


class ScriptedModel:
    """Answers with ``policy(request, n)`` where ``n`` counts calls so far.

    A policy that depends on ``n`` models a real LLM's non-determinism: asked
    again, it would say something else.
    """

    def __init__(self, policy: Policy | Sequence[Message], model_id: str = "scripted-1") -> None:
        self.model_id = model_id
        self._policy: Policy = policy if callable(policy) else _from_list(policy)
        self.calls = 0
        self._lock = threading.Lock()

    def complete(self, request: ModelRequest) -> ModelResponse:
        with self._lock:
            n = self.calls
            self.calls += 1
        message = self._policy(request, n)
        prompt = sum(len(m.text.split()) for m in request.messages)
        completion = len(message.text.split()) + 8 * len(message.tool_calls)
        usage = Usage(prompt, completion, prompt + completion)
        finish = "tool_calls" if message.tool_calls else "stop"
        return ModelResponse(message=message, model=self.model_id, usage=usage, finish_reason=finish)


def _from_list(replies: Sequence[Message]) -> Policy:
    def policy(request: ModelRequest, n: int) -> Message:
        if n >= len(replies):
            raise RuntimeError(f"scripted model has only {len(replies)} replies")
        return replies[n]

    return policy
