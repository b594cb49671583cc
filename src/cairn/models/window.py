"""Fitting a growing conversation into a model's context window: the policy,
the token counts, and what to send (no I/O here; ``cairn.engine.contextwindow``
journals the decisions).

A long agent loop resends its whole conversation on every turn until the
provider refuses it. A ``ContextPolicy`` says when that is about to happen
(a token threshold, by default a fraction of the model's window from
``KNOWN_WINDOWS``) and what to do then:

1. trim old tool outputs: all but the last ``keep_tool_outputs`` are replaced
   by a short placeholder (no model call; tool outputs are usually the bulk);
2. if that is not enough, summarize: the messages before the last
   ``keep_last`` (the cut moved back so that a tool call is never separated
   from its results) are replaced by one summary message, made by a model
   call over the previous summary and the newly summarized messages.

System messages at the start and the ``pin`` ned ones are always sent as
they are. Compaction is rare by design: once triggered it brings the request
well under the threshold, so the next many turns send a stable prefix (cheap
for the journal, which stores each message once, and for provider caches).

Token counts come from the provider where it reported them (the previous
call's usage, plus a count of what was added since), else from the policy's
counter: an approximation by default (JSON bytes / 3, rounded up, plus a
per-message overhead: pessimistic for English and code), or ``tiktoken``
when the policy asks for it (``tiktoken_counter()``: never picked up just
because it happens to be installed, since counts decide when a run compacts
and a replay elsewhere must decide the same). ``Count.source`` says which
was used; the journal records it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from cairn.errors import InvalidArgument, MissingExtra
from cairn.models.base import Message, ModelClient, ModelRequest, Usage
from cairn.retry import TerminalError

__all__ = [
    "KNOWN_WINDOWS",
    "ContextOverflow",
    "ContextPolicy",
    "Count",
    "TokenCounter",
    "known_window",
    "safe_cut",
    "summary_message",
    "summary_request",
    "tiktoken_counter",
    "trimmed",
]

#: Context windows in tokens of models Cairn knows, by model id prefix (the
#: longest matching prefix wins). ``ContextPolicy(window=...)`` overrides it.
KNOWN_WINDOWS: dict[str, int] = {
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-32k": 32_768,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude-": 200_000,
    "mistral-large": 128_000,
    "llama-3.1": 128_000,
    "llama3.1": 128_000,
    "qwen2.5": 32_768,
}

SUMMARY_PROMPT = (
    "You compress the earlier part of a conversation between a user, an assistant and its tools, so that "
    "the assistant can continue the task without it. Keep every fact, decision, open question, identifier, "
    "number and tool result the rest of the task may need; drop chit-chat. Answer with the summary only."
)
#: how a summary is introduced to the model in the requests that follow it
SUMMARY_HEADER = "Summary of the earlier conversation (it replaces those messages):\n"
#: at most this many characters of one message go into a summarizing request
TRANSCRIPT_CHARS = 4000


class ContextOverflow(TerminalError, InvalidArgument):
    """The request cannot be brought under the model's window by this policy
    (the kept messages alone are too large): nothing was sent."""


@dataclass(frozen=True)
class ContextPolicy:
    """When and how ``ctx.model(..., context=policy)`` compacts a conversation.

    ``window``: the model's context window in tokens (default: from
    ``KNOWN_WINDOWS`` by the model id). Compaction starts when a request
    would exceed ``threshold`` tokens (default ``trigger`` x window).
    ``keep_last``: messages at the end always sent as they are (more if a
    tool call's results would be cut off). ``keep_tool_outputs``: tool
    outputs kept in full when trimming (``None``: no trimming).
    ``summarize``: summarize when trimming is not enough, with ``summarizer``
    (default: the model being called) and ``summary_prompt``. ``pin``:
    indexes of messages (of the list given to ``ctx.model``) always sent.
    ``name``: the conversation, when a run holds several (one conversation
    per name, its calls one after another: its state is the order of its
    compactions). ``provider``:
    where the client can compact on the provider's side
    (``compaction_params``), ask it to at the threshold; what precedes its
    last compaction block is sent but not counted (the provider ignores it).
    ``thread``: mirror the conversation into thread memory (the run's
    thread if ``True``): each message appended once, each summary stored by
    the thread's compaction (``Thread.compact``) with the range it covers.

    A policy is part of what a run's code decides: changing it changes the
    requests a replay would make (pin it with the bundle like a prompt).
    """

    window: int | None = None
    trigger: float = 0.75
    threshold: int | None = None
    keep_last: int = 8
    keep_tool_outputs: int | None = 4
    summarize: bool = True
    summarizer: ModelClient | None = None
    summary_prompt: str = SUMMARY_PROMPT
    pin: tuple[int, ...] = ()
    name: str = "context"
    #: let the provider compact where it can (``client.compaction_params``,
    #: e.g. Anthropic's ``compact_20260112``); Cairn's own strategies then
    #: act only if a request would still exceed the window
    provider: bool = False
    #: keep the conversation in thread memory too: ``True`` the run's
    #: thread, or a thread id (``engine.contextwindow``: each message
    #: appended once, each summary stored by the thread's compaction)
    thread: str | bool = False
    #: how tokens are counted where the provider has not said (default: the
    #: approximation; ``tiktoken_counter()`` with the ``tokens`` extra)
    tokens: TokenCounter | None = field(default=None, compare=False)

    def bundle_pin(self) -> dict[str, Any]:
        """The policy as a bundle's code hash pins it (``engine.bundles``):
        every setting that decides the requests, the summarizer and token
        counter by kind."""
        return {"window": self.window, "trigger": self.trigger, "threshold": self.threshold,
                "keep_last": self.keep_last, "keep_tool_outputs": self.keep_tool_outputs,
                "summarize": self.summarize, "summary_prompt": self.summary_prompt, "pin": list(self.pin),
                "name": self.name, "provider": self.provider, "thread": self.thread,
                "summarizer": None if self.summarizer is None else _kind(self.summarizer),
                "tokens": None if self.tokens is None else self.tokens.name}

    def __post_init__(self) -> None:
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 64):
            raise InvalidArgument(f"a context window is a number of tokens >= 64, not {self.window!r}")
        if not (isinstance(self.trigger, int | float) and 0 < self.trigger <= 1):
            raise InvalidArgument(f"a context trigger is a fraction of the window in (0, 1], "
                                  f"not {self.trigger!r}")
        if self.threshold is not None and (isinstance(self.threshold, bool)
                                           or not isinstance(self.threshold, int) or self.threshold < 1):
            raise InvalidArgument(f"a context threshold is a positive number of tokens, "
                                  f"not {self.threshold!r}")
        if isinstance(self.keep_last, bool) or not isinstance(self.keep_last, int) or self.keep_last < 1:
            raise InvalidArgument(f"keep_last must be a positive number of messages, not {self.keep_last!r}")
        if self.keep_tool_outputs is not None and (
                isinstance(self.keep_tool_outputs, bool) or not isinstance(self.keep_tool_outputs, int)
                or self.keep_tool_outputs < 0):
            raise InvalidArgument(f"keep_tool_outputs must be a number >= 0 or None, "
                                  f"not {self.keep_tool_outputs!r}")
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.pin):
            raise InvalidArgument(f"pinned messages are indexes >= 0, not {self.pin!r}")
        if not isinstance(self.thread, str | bool) or self.thread == "":
            raise InvalidArgument(f"a context policy's thread is True or a thread id, not {self.thread!r}")
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument(f"a context policy's name must be a non-empty string, not {self.name!r}")

    def window_of(self, model_id: str) -> int:
        """The window of ``model_id``: this policy's, else the known one."""
        if self.window is not None:
            return self.window
        found = known_window(model_id)
        if found is None:
            raise InvalidArgument(f"no known context window for model {model_id!r}: "
                                  "give it with ContextPolicy(window=...)")
        return found

    def threshold_of(self, model_id: str) -> int:
        window = self.window_of(model_id)
        return min(window, self.threshold) if self.threshold is not None else int(window * self.trigger)

    def digest_fields(self, model_id: str) -> dict[str, Any]:
        """What of the policy decides the requests (recorded in the journal)."""
        return {"window": self.window_of(model_id), "threshold": self.threshold_of(model_id),
                "keep_last": self.keep_last, "keep_tool_outputs": self.keep_tool_outputs,
                "summarize": self.summarize, "pin": list(self.pin), "provider": self.provider,
                "thread": self.thread,
                "summarizer": (self.summarizer.model_id if self.summarizer is not None else model_id)}


def known_window(model_id: str) -> int | None:
    """The window of the longest ``KNOWN_WINDOWS`` prefix of ``model_id`` (a
    provider prefix such as ``openai/`` is ignored)."""
    name = model_id.rsplit("/", 1)[-1].lower()
    best: tuple[int, int] | None = None
    for prefix, window in KNOWN_WINDOWS.items():
        if name.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), window)
    return None if best is None else best[1]


# -- counting -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Count:
    """A request's size in tokens and where the number came from:
    ``provider`` (the provider's usage for what was sent before, plus a
    count of the rest), ``tiktoken:<encoding>`` or ``approx``."""

    tokens: int
    source: str


#: tokens a message costs beyond its text (role, separators), as providers count them
MESSAGE_OVERHEAD = 4


class TokenCounter:
    """Counts messages with ``encode`` (text -> token count) or the
    approximation; remembers each message object's count, so a loop that
    resends its history counts each message once."""

    def __init__(self, name: str = "approx", encode: Callable[[str], int] | None = None) -> None:
        self.name = name
        self._encode = encode
        self._seen: dict[int, tuple[Message, int]] = {}

    def message(self, message: Message) -> int:
        seen = self._seen.get(id(message))
        if seen is not None and seen[0] is message:
            return seen[1]
        data = msgspec.json.encode(message)
        if self._encode is None:
            tokens = math.ceil(len(data) / 3) + MESSAGE_OVERHEAD
        else:
            tokens = self._encode(data.decode()) + MESSAGE_OVERHEAD
        if len(self._seen) > 100_000:  # a bound, not a cache policy: loops resend the same objects
            self._seen.clear()
        self._seen[id(message)] = (message, tokens)
        return tokens

    def messages(self, messages: Sequence[Message]) -> int:
        return sum(self.message(m) for m in messages)

    def fresh(self) -> TokenCounter:
        """The same counting with an empty memory (one per conversation)."""
        return TokenCounter(self.name, self._encode)

    def tools(self, tools: Sequence[dict[str, Any]]) -> int:
        data = msgspec.json.encode(list(tools))
        return math.ceil(len(data) / 3) if self._encode is None else self._encode(data.decode())


def tiktoken_counter(encoding: str = "o200k_base") -> TokenCounter:
    """Counts with ``tiktoken``'s ``encoding`` (the ``tokens`` extra), for
    ``ContextPolicy(tokens=tiktoken_counter())``. Never chosen silently:
    counts decide when a run compacts, so a replay on a machine without
    tiktoken must fail here, not count differently and diverge."""
    try:
        import tiktoken  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise MissingExtra("tiktoken token counts", "tokens") from None
    loaded = tiktoken.get_encoding(encoding)

    def encode(text: str) -> int:
        return len(loaded.encode(text, disallowed_special=()))

    return TokenCounter(f"tiktoken:{encoding}", encode)


@dataclass
class Sent:
    """The last request of a conversation and the provider's count of it
    (prompt and answer): the base of the next count."""

    messages: tuple[Message, ...]
    answer: Message
    usage: Usage


def count_request(tokens: TokenCounter, messages: Sequence[Message], tools: Sequence[dict[str, Any]],
                  last: Sent | None) -> Count:
    """The size of a request: the provider's count of the previous request
    and its answer when this one extends them, plus a count of the rest."""
    if last is not None and last.usage.prompt_tokens > 0:
        n = len(last.messages)
        if (len(messages) > n and messages[n] == last.answer
                and all(a is b or a == b for a, b in zip(messages[:n], last.messages, strict=False))):
            base = last.usage.prompt_tokens + max(last.usage.completion_tokens, tokens.message(last.answer))
            return Count(base + tokens.messages(messages[n + 1:]), "provider")
    return Count(tokens.messages(messages) + tokens.tools(tools), tokens.name)


# -- deciding what to send ---------------------------------------------------------------


def head_indexes(messages: Sequence[Message], pin: Sequence[int]) -> list[int]:
    """The leading system messages and the pinned ones: always sent."""
    head = []
    for i, message in enumerate(messages):
        if message.role not in ("system", "developer"):
            break
        head.append(i)
    return sorted(set(head) | {i for i in pin if i < len(messages)})


def compacted_at(messages: Sequence[Message], start: int) -> int:
    """The index of the last message (from ``start``) holding a provider's
    ``compaction`` block, else ``start``: the provider ignores what precedes it."""
    for i in range(len(messages) - 1, start - 1, -1):
        content = messages[i].content
        if isinstance(content, tuple) and any(part.get("type") == "compaction" for part in content):
            return i
    return start


def safe_cut(messages: Sequence[Message], cut: int, floor: int) -> int:
    """``cut`` moved back (not below ``floor``) until the kept tail does not
    start with a tool result: a call and its results stay on one side."""
    while cut > floor and messages[cut].role == "tool":
        cut -= 1
    return cut


def trimmed(message: Message) -> Message:
    """A tool output replaced by a placeholder (the call id and name kept;
    its size in characters, which no tokenizer choice changes)."""
    return Message(role=message.role,
                   content=f"[tool output removed to save context: {len(message.text)} characters]",
                   tool_call_id=message.tool_call_id, name=message.name)


def summary_message(summary: str) -> Message:
    return Message(role="user", content=SUMMARY_HEADER + summary)


def summary_request(policy: ContextPolicy, previous: str | None, messages: Sequence[Message]) -> ModelRequest:
    """The request that summarizes ``messages`` (after ``previous``, the
    summary they continue). Each message is shown as text, cut to
    ``TRANSCRIPT_CHARS``: the summarizer reads a transcript, it does not
    continue the conversation (no tool calls are pending in it)."""
    lines = []
    if previous:
        lines.append(f"Summary so far:\n{previous}\n")
    lines.append("Messages to add to the summary:")
    for message in messages:
        text = message.text if message.content is not None else ""
        if message.tool_calls:
            text += "".join(f"\n[calls {c.name}({c.arguments})]" for c in message.tool_calls)
        if len(text) > TRANSCRIPT_CHARS:
            text = text[:TRANSCRIPT_CHARS] + f" [... {len(text) - TRANSCRIPT_CHARS} more characters]"
        who = f"{message.role} {message.name}" if message.name else message.role
        lines.append(f"<{who}>\n{text}\n</{who}>")
    return ModelRequest((Message(role="system", content=policy.summary_prompt),
                         Message(role="user", content="\n".join(lines))))


def _kind(value: object) -> str:
    """A value by its class and, for a model client, the model it names."""
    model = getattr(value, "model", None)
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return f"{kind}:{model}" if isinstance(model, str) else kind
