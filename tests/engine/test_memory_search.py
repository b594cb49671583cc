"""Semantic search of long-term memory from a workflow (issue 14 items 2 and
4), sync and async, on both backends: what a step wrote is found once the
embedding worker indexed it, counted as unindexed until then, and a search
is journaled like every read (replay sees the first answer, not a new one)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer
from tests.engine.conftest import execute_once
from tests.engine.kinds import Flow, Kind, both

DOCS = ("docs",)
TEXTS = {"tea": "green tea with jasmine", "coffee": "black coffee, no sugar", "bike": "a red bicycle"}


@pytest.fixture
def searching(app: cairn.App) -> Iterator[cairn.App]:
    """The test's store, with an embedder (what ``App(embedder=...)`` sets)."""
    assert app.db_url is not None
    searching = cairn.App(db=app.db_url, lease_seconds=5.0, embedder=HashEmbedder(64))
    yield searching
    searching.close()


def _found(result: cairn.SearchResult) -> tuple[list[str], int]:
    return [hit.item.key for hit in result.hits], result.unindexed


@both
def test_a_workflow_finds_what_its_step_wrote_once_indexed_and_replays_its_first_answer(
    searching: cairn.App, kind: Kind
) -> None:
    app = searching
    embedder = app.runtime.memory.embedder
    assert embedder is not None

    def write() -> int:
        memory = cairn.step_info().memory
        for key, text in TEXTS.items():
            kind_ = "toy" if key == "bike" else "drink"
            memory.put(DOCS, key, {"text": text}, index=text, metadata={"kind": kind_})
        return len(TEXTS)

    step = app.step()(kind.fn(write))

    @kind.workflow(app, "seeker")
    def seeker(ctx: cairn.Context) -> Flow[list[Any]]:
        yield step()
        before = _found(ctx.memory.search(DOCS, "jasmine tea", k=2))
        ctx.sleep(0.5)  # the next execution replays the search above (long enough never to be due at once)
        after = _found(ctx.memory.search(DOCS, "jasmine tea", k=2))
        drinks = _found(ctx.memory.search(DOCS, "a red bicycle", k=3, filter={"kind": "drink"}))
        return [before, after, drinks]

    app.start(seeker, run_id="s1")
    assert execute_once(app, "s1") == "suspended"
    assert Indexer(app.store, embedder).drain() == 3  # what the step wrote, indexed between the executions
    time.sleep(0.55)
    before, after, drinks = app.resume("s1")
    assert before == [[], 3]  # nothing indexed yet: said so, not silently missed; replayed as first seen
    assert after[0][0] == "tea"  # indexed now: the nearest first
    assert after[1] == 0
    # the filter narrows the scan before the top-k cut: the bicycle, nearest
    # to its own text, is never a candidate; both drinks are
    assert set(drinks[0]) == {"coffee", "tea"}
    assert drinks[1] == 0


def test_one_embedder_per_app(tmp_path: Path) -> None:
    """``App(embedder=)`` is short for the policy's embedder: the same one
    twice is fine, two different ones are refused with one line, and a bad
    ``cold_after`` is refused before anything is opened."""
    one, other = HashEmbedder(64), HashEmbedder(32)
    db = f"sqlite:///{tmp_path}/cairn.db"
    same = cairn.App(db=db, embedder=one, memory=cairn.MemoryPolicy(embedder=one))
    try:
        assert same.runtime.memory.embedder is one
    finally:
        same.close()
    elsewhere = tmp_path / "never.db"
    with pytest.raises(cairn.InvalidArgument, match="two embedders"):
        cairn.App(db=f"sqlite:///{elsewhere}", embedder=one, memory=cairn.MemoryPolicy(embedder=other))
    assert not elsewhere.exists()  # refused before anything was opened or created
    with pytest.raises(cairn.InvalidArgument, match="cold_after"):
        cairn.MemoryPolicy(cold_after=0)
