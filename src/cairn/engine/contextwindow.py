"""Context management as journaled steps: ``ctx.model(..., context=policy)``.

Before each model call of a conversation, the request is counted
(``cairn.models.window``); if it would pass the policy's threshold, the
conversation is compacted, and every decision that is not a pure function
of the run's own inputs is journaled:

* the summary is a model call of its own (``modelcalls.ask``, the summarizer
  at its own position), so a replay or a recovery returns the recorded
  summary and the summarizer is never asked twice for it;
* the compaction is a journal entry of kind ``context`` (named after the
  policy) holding what it did: the range it summarized, the tool outputs it
  trimmed, the summary, and the token counts before and after with where
  they came from. ``cairn show`` prints it as such. On replay the recorded
  entry is used, not recomputed.

Between compactions the conversation's state (how much is summarized, which
tool outputs are trimmed, the last request and its usage) is a function of
the journal, rebuilt by the replay that re-runs the workflow: it lives with
the execution, like the model log.

The caller keeps passing its whole history, append-only: indexes in the
compaction entries are indexes of that list, and a history whose summarized
part was rewritten is refused (the last summarized message is fingerprinted).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from cairn.codec import values
from cairn.engine import modelcalls
from cairn.engine.drive import Protocol
from cairn.engine.execution import Execution
from cairn.engine.memory import workflow_memory
from cairn.errors import InvalidArgument
from cairn.faults import fault_point
from cairn.memory.api import Thread
from cairn.models.base import Message, ModelClient, ModelRequest, ModelResponse
from cairn.models.errors import ModelRequestError
from cairn.models.window import (
    ContextOverflow,
    ContextPolicy,
    Count,
    Sent,
    TokenCounter,
    compacted_at,
    count_request,
    head_indexes,
    safe_cut,
    summary_message,
    summary_request,
    trimmed,
)
from cairn.retry import RetryPolicy

__all__ = ["Compaction", "ask"]


class Compaction(msgspec.Struct, frozen=True, omit_defaults=True):
    """One compaction, as journaled (kind ``context``). Indexes are of the
    message list given to ``ctx.model``: ``summarized`` = [first, upto) now
    replaced by ``summary`` (with what earlier summaries covered);
    tool outputs before ``trimmed_before`` are placeholders (``trimmed`` of
    them newly so)."""

    strategy: str
    tokens_before: int
    tokens_after: int
    counted_by: str
    window: int
    threshold: int
    upto: int = 0
    first: int = 0
    removed: int = 0
    trimmed_before: int = 0
    trimmed: int = 0
    summary: str | None = None
    anchor: str | None = None


@dataclass
class _Conversation:
    upto: int = 0
    summary: str | None = None
    anchor: str | None = None
    trimmed_before: int = 0
    last: Sent | None = None
    tokens: TokenCounter = field(default_factory=TokenCounter)
    #: ``thread``: the thread index of message 0, and how many messages are in the thread
    base: int | None = None
    mirrored: int = 0


_STATES: weakref.WeakKeyDictionary[Execution, dict[str, _Conversation]] = weakref.WeakKeyDictionary()


def _state(ex: Execution, policy: ContextPolicy) -> _Conversation:
    states = _STATES.setdefault(ex, {})
    found = states.get(policy.name)
    if found is None:
        found = states[policy.name] = _Conversation(
            tokens=policy.tokens.fresh() if policy.tokens is not None else TokenCounter())
    return found


def ask(
    ex: Execution, client: ModelClient, request: ModelRequest, retry: RetryPolicy | None,
    policy: ContextPolicy, *, is_async: bool,
) -> Protocol[ModelResponse]:
    """``modelcalls.ask`` with ``request`` fitted to the window first."""
    state = _state(ex, policy)
    messages = request.messages
    _check_history(state, messages, policy)
    if policy.thread:
        _mirror(ex, state, messages, policy)
    sent = _effective(state, messages, policy)
    count = count_request(state.tokens, sent, request.tools, state.last)
    compacted = compacted_at(sent, 0) if policy.provider else 0
    if compacted:  # the provider ignores what precedes its compaction block: it is sent, not counted
        kept = [m for m in sent[:compacted] if m.role in ("system", "developer")] + sent[compacted:]
        count = count_request(state.tokens, kept, request.tools, None)
    threshold = policy.threshold_of(client.model_id)
    provider: Callable[[int], dict[str, Any]] | None = getattr(client, "compaction_params", None)
    if policy.provider and provider is not None:
        # the provider compacts at the threshold; Cairn only if the window itself would be passed
        if "context_management" not in request.params:
            request = ModelRequest(messages, request.tools, {**request.params, **provider(threshold)})
        threshold = policy.window_of(client.model_id)
    if count.tokens > threshold:
        yield from _compact(ex, client, request, retry, policy, state, count, is_async=is_async)
        sent = _effective(state, messages, policy)
    fitted = ModelRequest(tuple(sent), request.tools, request.params)
    response = yield from modelcalls.ask(ex, client, fitted, retry, is_async=is_async)
    state.last = Sent(fitted.messages, response.message, response.usage)
    return response


def _check_history(state: _Conversation, messages: Sequence[Message], policy: ContextPolicy) -> None:
    if state.upto > len(messages) or (state.anchor is not None and
                                      _fingerprint(messages[state.upto - 1]) != state.anchor):
        raise InvalidArgument(
            f"the conversation given to ctx.model changed: messages up to index {state.upto} were "
            f"summarized by context policy {policy.name!r}, and the list no longer holds them "
            "(pass the whole history, appending only)")


def _effective(state: _Conversation, messages: Sequence[Message], policy: ContextPolicy) -> list[Message]:
    """What is sent: the head, the summary, then the rest with old tool outputs trimmed."""
    sent = [messages[i] for i in head_indexes(messages, policy.pin) if i < state.upto]
    if state.summary is not None:
        sent.append(summary_message(state.summary))
    for i in range(state.upto, len(messages)):
        message = messages[i]
        if i < state.trimmed_before and message.role == "tool":
            message = trimmed(message)
        sent.append(message)
    return sent


def _compact(
    ex: Execution, client: ModelClient, request: ModelRequest, retry: RetryPolicy | None,
    policy: ContextPolicy, state: _Conversation, before: Count, *, is_async: bool,
) -> Protocol[None]:
    """Trim, then summarize if still needed; journal what was done (or replay it)."""
    messages = request.messages
    window, threshold = policy.window_of(client.model_id), policy.threshold_of(client.model_id)
    head = set(head_indexes(messages, policy.pin))
    # 1. trim every tool output but the last few
    trim_before = state.trimmed_before
    if policy.keep_tool_outputs is not None:
        tools_at = [i for i in range(state.upto, len(messages)) if messages[i].role == "tool"]
        if len(tools_at) > policy.keep_tool_outputs:
            trim_before = max(trim_before, tools_at[len(tools_at) - policy.keep_tool_outputs - 1] + 1)
    # 2. summarize if trimming leaves the request over half the threshold: compacting
    # to just under it would compact again a few turns later
    after_trim = _count(state, messages, policy, request, state.upto, state.summary, trim_before)
    upto = state.upto
    if policy.summarize and after_trim.tokens > threshold // 2:
        floor = max(state.upto, max(head, default=-1) + 1)
        upto = safe_cut(messages, max(floor, len(messages) - policy.keep_last), floor)
        if not any(i not in head for i in range(state.upto, upto)):
            upto = state.upto  # nothing but kept messages before the cut: nothing to summarize
    if upto == state.upto and trim_before == state.trimmed_before:  # nothing left to compact
        if before.tokens > window:
            raise _overflow(policy, client, window, before)
        return
    summary = state.summary
    if upto > state.upto:
        covered = [trimmed(messages[i]) if i < trim_before and messages[i].role == "tool" else messages[i]
                   for i in range(state.upto, upto) if i not in head]
        answer = yield from modelcalls.ask(ex, policy.summarizer or client,
                                           summary_request(policy, state.summary, covered), retry,
                                           is_async=is_async)
        summary = _summary_text(answer)
        fault_point("context.after_summary")
    plan = {"policy": policy.digest_fields(client.model_id), "from": state.upto, "upto": upto,
            "trim_before": trim_before}
    call = ex.begin("context", policy.name, values.digest(values.encode(plan)))
    if call.recorded is not None:
        record: Compaction = ex.replay(call, Compaction)
    else:
        after = _count(state, messages, policy, request, upto, summary, trim_before)
        if after.tokens > window:
            raise _overflow(policy, client, window, after)
        trimmed_now = sum(1 for i in range(max(state.trimmed_before, upto), trim_before)
                          if messages[i].role == "tool")
        did = (("trim", trimmed_now > 0), ("summarize", upto > state.upto))
        strategy = "+".join(name for name, done in did if done)
        record = Compaction(
            strategy=strategy or "none", tokens_before=before.tokens, tokens_after=after.tokens,
            counted_by=before.source, window=window, threshold=threshold, upto=upto, first=state.upto,
            removed=sum(1 for i in range(state.upto, upto) if i not in head), trimmed_before=trim_before,
            trimmed=trimmed_now, summary=summary, anchor=_fingerprint(messages[upto - 1]) if upto else None,
        )
        detail = {"strategy": record.strategy, "summarized": [record.first, record.upto],
                  "removed": record.removed, "trimmed": record.trimmed, "tokens_before": record.tokens_before,
                  "tokens_after": record.tokens_after, "counted_by": record.counted_by}
        record = ex.complete_call(call, record, Compaction, detail=detail)
    if policy.thread and record.summary is not None and record.upto > record.first:
        assert state.base is not None
        _thread(ex, policy).compact(state.base + record.upto, {
            "summary": record.summary, "covers": [record.first, record.upto], "policy": policy.name})
    state.upto, state.summary, state.anchor = record.upto, record.summary, record.anchor
    state.trimmed_before = record.trimmed_before
    state.last = None  # the next request no longer extends the last one


def _thread(ex: Execution, policy: ContextPolicy) -> Thread:
    thread_id = policy.thread if isinstance(policy.thread, str) else ex.run.thread_id
    if not thread_id:
        raise InvalidArgument(f"context policy {policy.name!r} keeps the conversation in the run's thread, "
                              f"and run {ex.run.run_id!r} has none: start it with a thread_id, or name one")
    return workflow_memory(ex).thread(thread_id)


def _mirror(ex: Execution, state: _Conversation, messages: Sequence[Message], policy: ContextPolicy) -> None:
    """Append the messages the thread does not hold yet (journaled writes,
    like any ``ctx.memory`` write); the first time, read where they start."""
    thread = _thread(ex, policy)
    if state.base is None:
        last = thread.window(last=1)
        state.base = last[-1].index + 1 if last else 0
    if len(messages) > state.mirrored:
        thread.append(*(msgspec.to_builtins(m) for m in messages[state.mirrored:]))
        state.mirrored = len(messages)


def _count(state: _Conversation, messages: Sequence[Message], policy: ContextPolicy, request: ModelRequest,
           upto: int, summary: str | None, trim_before: int) -> Count:
    probe = _Conversation(upto, summary, None, trim_before, None, state.tokens)
    return count_request(state.tokens, _effective(probe, messages, policy), request.tools, None)


def _overflow(policy: ContextPolicy, client: ModelClient, window: int, count: Count) -> ContextOverflow:
    return ContextOverflow(
        f"context policy {policy.name!r} cannot fit the request to {client.model_id!r} into its "
        f"{window}-token window: {count.tokens} tokens ({count.source}) with all it may compact compacted "
        f"(keep_last={policy.keep_last}, keep_tool_outputs={policy.keep_tool_outputs}); nothing was sent")


def _summary_text(response: ModelResponse) -> str:
    text = response.message.text.strip()
    if not text:
        raise ModelRequestError(f"the summarizing model {response.model!r} answered with no text")
    return text


def _fingerprint(message: Message) -> str:
    return values.digest(values.encode(message))
