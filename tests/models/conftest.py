"""Fixtures for model-client tests: a fake server per test, clients that are
always closed, and an environment free of the host's OpenAI and Anthropic settings."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cairn.models.openai import OpenAIChat
from tests.models.fake_openai import FakeOpenAI

ENV_VARS = ("CAIRN_OPENAI_BASE_URL", "OPENAI_BASE_URL", "CAIRN_OPENAI_API_KEY", "OPENAI_API_KEY",
            "CAIRN_ANTHROPIC_BASE_URL", "ANTHROPIC_BASE_URL", "CAIRN_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's real key or base URL must not leak into (or change) a test."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def make_chat(server: FakeOpenAI) -> Iterator[Callable[..., OpenAIChat]]:
    """``make_chat(**options)``: an ``OpenAIChat`` aimed at the fake server
    (unless ``base_url`` is given), closed at the end of the test."""
    made: list[OpenAIChat] = []

    def make(model: str = "gpt-test", **options: Any) -> OpenAIChat:
        options.setdefault("base_url", server.url)
        chat = OpenAIChat(model, **options)
        made.append(chat)
        return chat

    yield make
    for chat in made:
        chat.close()
