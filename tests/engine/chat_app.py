"""A chat agent for the model-journal crash test, run in a child process
that SIGKILLs itself at a fault point (``$CAIRN_FAULTS``), then resumed by
the test in its own process.

The model answers differently on every ask (its answer names the process and
a counter), and appends every request it is sent to ``$CAIRN_TEST_ASKS``: the
test compares them with the requests rebuilt from the journal.
"""

from __future__ import annotations

import os
import sys

import cairn
from cairn.codec import values
from cairn.models import Message, ModelRequest, ScriptedModel, ToolCall

app = cairn.App(db=os.environ["CAIRN_TEST_DB"], lease_seconds=0.5)

TOOLS = ({"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}},)
SYSTEM = Message(role="system", content="You take notes. " * 20)


def answer(request: ModelRequest, n: int) -> Message:
    with open(os.environ["CAIRN_TEST_ASKS"], "ab") as asks:
        asks.write(values.encode(request) + b"\n")
    tag = f"pid {os.getpid()} ask {n}"
    call = ToolCall(id=f"call-{tag}", name="note", arguments=values.encode({"text": tag}).decode())
    return Message(role="assistant", content=f"noting ({tag})", tool_calls=(call,))


model = ScriptedModel(answer, model_id="note-taker")


@app.step()
def note(arguments: str) -> str:
    return arguments.upper()


@app.workflow(name="chat")
def chat(ctx: cairn.Context, turns: int) -> list[str]:
    messages = [SYSTEM]
    for turn in range(turns):
        messages.append(Message(role="user", content=f"turn {turn}: " + "please take a note. " * 30,
                                name="ada"))
        reply = ctx.model(model, messages, tools=TOOLS, temperature=0)
        messages.append(reply.message)
        call = reply.message.tool_calls[0]
        messages.append(Message(role="tool", tool_call_id=call.id, name=call.name,
                                content=note(call.arguments)))
    return [m.content or "" for m in messages if m.role == "assistant"]


if __name__ == "__main__":
    app.run(chat, int(sys.argv[2]), run_id=sys.argv[1])
