"""Fixtures of the secrets tests: the engine's ``app`` (SQLite and
PostgreSQL) and ``calls``, and a clean registry of revealed values."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cairn.security import redaction
from tests.engine.conftest import app, calls

__all__ = ["app", "calls"]


@pytest.fixture(autouse=True)
def _nothing_revealed() -> Iterator[None]:
    """Each test starts in a process where no secret was revealed (the
    registry is process-wide: a value revealed by one test would make
    another's innocent payload look like a leak, or mask its messages)."""
    redaction.forget_all()
    yield
    redaction.forget_all()
