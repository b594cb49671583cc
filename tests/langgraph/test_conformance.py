"""LangGraph's own checkpointer conformance suite (langgraph-checkpoint-conformance,
81 tests over eight capabilities) against ``CairnSaver`` on both backends:
every capability must be detected (the extended ones too: delete_for_runs,
copy_thread, prune) and pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import cairn


def test_every_capability_is_detected_and_passes(app: cairn.App) -> None:
    from langgraph.checkpoint.conformance import checkpointer_test, validate
    from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

    from cairn.langgraph import CairnSaver

    @checkpointer_test(name="CairnSaver")
    async def saver() -> AsyncGenerator[CairnSaver, None]:
        yield CairnSaver(app, tenant="conformance")

    report = asyncio.run(validate(saver))
    failures = {name: result.failures for name, result in report.results.items() if not result.passed}
    assert failures == {}
    assert {name for name, result in report.results.items() if result.detected} == {
        c.value for c in ALL_CAPABILITIES}
    passed = sum(result.tests_passed for result in report.results.values())
    assert passed == 81
