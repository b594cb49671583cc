"""What context management costs a model call that does not compact.

    python -m bench.context_window                  # 100-message conversation, 9 rounds
    python -m bench.context_window --messages 300 --rounds 9

Issue 28's budget: the bookkeeping of ``ctx.model(..., context=policy)``
(counting the request's tokens and checking the trigger) is at most 5 % of a
journaled model call on a 100-message conversation. Two figures:

* **direct**: the bookkeeping alone, as ``contextwindow.ask`` does it before
  every call (the effective message list, the count, the threshold) on a
  ``--messages`` conversation that grows by two messages per call, the
  previous request's provider usage known (the common case);
* **end to end**: a workflow making ``--calls`` model calls (a scripted model
  that answers at once, journaled on SQLite) on a conversation of
  ``--messages`` messages growing by two a call (the answer and the next question), with and without a policy
  whose window is never reached; rounds alternate the two, the median per
  call is compared. Noisier (two journaled runs subtracted), it shows the
  cost where users see it.

Figures are per call, in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import cairn
from cairn.engine.contextwindow import _Conversation, _effective
from cairn.models import ContextPolicy, Message, ScriptedModel, Usage
from cairn.models.window import Sent, count_request

POLICY = ContextPolicy(window=10_000_000)


def conversation(n: int) -> list[Message]:
    text = "a fairly ordinary sentence of an agent's conversation, " * 8  # ~440 bytes
    return [Message(role="system", content="You are a careful agent.")] + [
        Message(role="user" if i % 2 else "assistant", content=f"{i}: {text}") for i in range(n - 1)]


def direct(n: int, calls: int) -> float:
    """µs per call of the bookkeeping alone."""
    history = conversation(n)
    state = _Conversation()
    threshold = POLICY.threshold_of("m")
    answer = Message(role="assistant", content="ok")
    started = time.perf_counter()
    for _ in range(calls):
        sent = _effective(state, history, POLICY)
        count = count_request(state.tokens, sent, (), state.last)
        assert count.tokens < threshold
        state.last = Sent(tuple(sent), answer, Usage(count.tokens, 2, count.tokens + 2))
        history += [answer, Message(role="user", content="next")]
    return (time.perf_counter() - started) / calls * 1e6


def end_to_end(n: int, calls: int, with_policy: bool, workdir: Path, tag: str) -> float:
    """µs per journaled model call, with or without the policy."""
    model = ScriptedModel(lambda request, k: Message(role="assistant", content="ok"), model_id="m")
    with cairn.App(db=f"sqlite:///{workdir}/{tag}.db") as app:
        @app.workflow(name="chat")
        def chat(ctx: cairn.Context) -> float:
            history = conversation(n)
            started = time.perf_counter()
            for _ in range(calls):
                reply = ctx.model(model, history, context=POLICY if with_policy else None)
                history += [reply.message, Message(role="user", content="next")]
            return time.perf_counter() - started

        seconds: float = app.run(chat, run_id=tag)
    return seconds / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    bookkeeping = statistics.median(direct(args.messages, args.calls) for _ in range(args.rounds))
    plain, managed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            plain.append(end_to_end(args.messages, args.calls, False, Path(tmp), f"plain{r}"))
            managed.append(end_to_end(args.messages, args.calls, True, Path(tmp), f"managed{r}"))
    call, with_ctx = statistics.median(plain), statistics.median(managed)
    print(f"{args.messages}-message conversation, {args.calls} calls a run, median of {args.rounds} rounds")
    print(f"journaled model call (no policy):      {call:8.1f} us")
    print(f"journaled model call (with a policy):  {with_ctx:8.1f} us  (+{with_ctx - call:.1f} us, "
          f"{(with_ctx - call) / call:+.1%})")
    print(f"bookkeeping alone (direct):            {bookkeeping:8.1f} us  "
          f"({bookkeeping / call:.1%} of a call)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
