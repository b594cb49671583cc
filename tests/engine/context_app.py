"""A long tool-using agent on a model with a 16k-token window, for the
context-management tests (in process, and in a child process that dies
during or right after a summarizing call, then is resumed by the test).

The model is a real ``ModelClient`` that behaves like a provider: it counts
each request with its own tokenizer (JSON bytes / 4 + 3 a message, not the
one Cairn uses), refuses a request over its window as a provider does, and
reports that count as its usage. It appends every request it is sent (its
kind and size) to ``$CAIRN_TEST_ASKS``, so the test sees every request,
including those of a process that died. ``$CAIRN_TEST_DIE_IN_SUMMARY=k``:
the process SIGKILLs itself while answering the k-th summarizing request.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from typing import Any

import msgspec

import cairn
from cairn.models import (
    ContextPolicy,
    Message,
    ModelRequest,
    ModelRequestError,
    ModelResponse,
    ToolCall,
    Usage,
)
from cairn.models.window import SUMMARY_PROMPT
from tests.timing import NAP

__all__ = ["POLICY", "SUMMARY_PROMPT", "SYSTEM", "TASK", "WINDOW", "WindowModel", "register", "true_tokens"]

WINDOW = 16_000
POLICY = ContextPolicy(window=WINDOW, keep_last=12, keep_tool_outputs=6, pin=(1,))
SYSTEM = Message(role="system", content="You are a careful research agent. " * 20)
TASK = Message(role="user", content="Look up every record from 1 to the last one, then say done.")
TOOLS = ({"type": "function", "function": {"name": "lookup", "description": "Read one record",
                                           "parameters": {"type": "object",
                                                          "properties": {"i": {"type": "integer"}}}}},)


def true_tokens(messages: tuple[Message, ...]) -> int:
    return sum(math.ceil(len(msgspec.json.encode(m)) / 4) + 3 for m in messages)


class WindowModel:
    """Answers like a provider with a ``window``-token context."""

    def __init__(self, turns: int, log: str | None = None) -> None:
        self.model_id = "agent-16k"
        self.turns = turns
        self.log = log
        self.summaries = 0
        self.asked = 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        size = true_tokens(request.messages)
        summarizing = request.messages[0].content == SUMMARY_PROMPT
        self._note({"kind": "summary" if summarizing else "turn", "tokens": size, "pid": os.getpid()})
        if size > WINDOW:
            raise ModelRequestError(f"context_length_exceeded: {size} tokens > {WINDOW}", status_code=400)
        self.asked += 1
        if summarizing:
            self.summaries += 1
            if os.environ.get("CAIRN_TEST_DIE_IN_SUMMARY") == str(self.summaries):
                os.kill(os.getpid(), signal.SIGKILL)
            summary = f"Summary {self.summaries}: " + "the records looked up were fine. " * 30
            message = Message(role="assistant", content=summary)
        else:
            last = request.messages[-1]
            done = int(last.text.split()[1].rstrip(":")) if last.role == "tool" else 0
            if done >= self.turns:
                message = Message(role="assistant", content="done")
            else:
                i = done + 1
                call = ToolCall(id=f"call_{i}", name="lookup", arguments=f'{{"i": {i}}}')
                message = Message(role="assistant", content=f"Reading record {i}.", tool_calls=(call,))
        return ModelResponse(message=message, model=self.model_id,
                             usage=Usage(size, 20, size + 20),
                             finish_reason="tool_calls" if message.tool_calls else "stop")

    def _note(self, entry: dict[str, Any]) -> None:
        if self.log:
            with open(self.log, "ab") as out:
                out.write(msgspec.json.encode(entry) + b"\n")


#: the same agent with no policy (the test that shows what the policy prevents)
POLICY_OFF = False


def register(app: cairn.App, model: WindowModel, sleep_every: int = 0, policy: ContextPolicy = POLICY) -> Any:
    """The agent (``sleep_every``: a durable sleep every that many turns, so
    the rest of the run is a replay of its journal)."""

    @app.tool(effect="read")
    def lookup(i: int) -> str:
        return f"record {i}: " + f"field{i} = value{i}; " * 40

    @app.workflow(name="agent")
    def agent(ctx: cairn.Context) -> int:
        history = [SYSTEM, TASK]
        turn = 0
        while True:
            turn += 1
            if sleep_every and turn % sleep_every == 0:
                ctx.sleep(NAP)  # suspends, however slow the commit of its deadline
            reply = ctx.model(model, history, tools=TOOLS, context=None if POLICY_OFF else policy)
            history.append(reply.message)
            if not reply.message.tool_calls:
                return len(history)
            for call in reply.message.tool_calls:
                output = lookup(**call.parsed_arguments())
                history.append(Message(role="tool", tool_call_id=call.id, name=call.name, content=output))

    return agent


if __name__ == "__main__":
    child = cairn.App(db=os.environ["CAIRN_TEST_DB"], lease_seconds=0.5)
    flow = register(child, WindowModel(int(sys.argv[2]), os.environ["CAIRN_TEST_ASKS"]))
    child.run(flow, run_id=sys.argv[1])
