"""Stored bytes of a chat loop's journal, before and after "each message once".

    python -m bench.model_journal              # 10, 40 and 80 turns of 1 KB messages
    python -m bench.model_journal 200 --size 4096

A chat loop sends the whole conversation on every model call. Each turn adds
a user message and the model's answer (both ``--size`` bytes of content). The
figure is every byte the run stored: the payload and detail of each history
entry, plus any artifacts they reference (deterministic, so no repeats needed).

"before" is the same run as the previous format stored it: the full request
of every call (``ModelRecord``), computed from the rebuilt requests in place
of the compact entries. "messages" is the size of the distinct messages
themselves (their JSON), the least any journal of the conversation can hold.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cairn
from cairn.codec import values
from cairn.engine import modelcalls
from cairn.models import Message, ModelRequest, ScriptedModel
from cairn.store.records import HistoryEvent, Payload


@dataclass(frozen=True, slots=True)
class Measure:
    turns: int
    messages: int  # bytes of the distinct messages (JSON)
    before: int  # bytes stored with a full request per call
    after: int  # bytes stored now

    @property
    def ratio(self) -> float:
        return self.after / self.messages


def text(kind: str, n: int, size: int) -> str:
    """``size`` characters of content, distinct per message."""
    head = f"{kind} {n}: "
    return head + ("lorem ipsum dolor sit amet " * (size // 27 + 1))[: size - len(head)]


def chat_app(app: cairn.App, size: int) -> cairn.Workflow[int]:
    def answer(request: ModelRequest, n: int) -> Message:
        return Message(role="assistant", content=text("assistant", n, size))

    model = ScriptedModel(answer, model_id="bench-chat")

    @app.workflow(name="chat")
    def chat(ctx: cairn.Context, turns: int) -> int:
        messages: list[Message] = []
        for turn in range(turns):
            messages.append(Message(role="user", content=text("user", turn, size)))
            messages.append(ctx.model(model, messages).message)
        return len(messages)

    return chat  # type: ignore[return-value]


def payload_bytes(app: cairn.App, payload: Payload | None) -> int:
    if payload is None:
        return 0
    if payload.data is not None:
        return len(payload.data)
    return len(app.store.get_artifact(payload.ref or ""))


def stored_bytes(app: cairn.App, history: Sequence[HistoryEvent]) -> int:
    """Payload and detail bytes of every entry, artifacts included."""
    return sum(payload_bytes(app, e.payload) + (len(values.encode(e.detail)) if e.detail else 0)
               for e in history)


def measure(app: cairn.App, turns: int, size: int = 1024, run_id: str | None = None) -> Measure:
    """Run a ``turns``-turn chat loop in ``app`` and measure what it stored."""
    run_id = run_id or f"chat-{turns}"
    workflow = "chat" if "chat" in app.runtime.workflows else chat_app(app, size)  # one size per app
    app.run(workflow, turns, run_id=run_id)
    history = app.history(run_id)
    after = stored_bytes(app, history)
    rebuilt = modelcalls.records(history, app.runtime.payloads)
    compact = sum(payload_bytes(app, e.payload) for e in history if e.seq in rebuilt)
    full = sum(len(values.encode(record)) for record in rebuilt.values())
    last = rebuilt[max(rebuilt)]
    conversation = [*last.request.messages, last.response.message]
    distinct = {values.encode(m) for m in conversation}
    return Measure(turns, sum(len(m) for m in distinct), after - compact + full, after)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("turns", nargs="*", type=int, default=[10, 40, 80])
    parser.add_argument("--size", type=int, default=1024, help="content bytes of each message")
    args = parser.parse_args(argv)
    print(f"{'turns':>6} {'messages':>10} {'before':>11} {'after':>10} {'after/messages':>15} "
          f"{'before/after':>13}")
    with tempfile.TemporaryDirectory(prefix="cairn-model-journal-") as tmp:
        app = cairn.App(db=f"sqlite:///{Path(tmp) / 'cairn.db'}")
        try:
            for turns in args.turns:
                m = measure(app, turns, args.size)
                print(f"{m.turns:>6} {m.messages:>10,} {m.before:>11,} {m.after:>10,} {m.ratio:>15.2f} "
                      f"{m.before / m.after:>13.1f}")
        finally:
            app.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
