"""Execution identity: ids are derived, stable and well-formed."""

from __future__ import annotations

import uuid

import cairn
from cairn.ids import uuid7


def test_operation_id_is_uuid5_of_run_and_position() -> None:
    namespace = uuid.UUID("6f1d3c2e-8a4b-4c7d-9e0f-0c41a1b2c3d4")
    for run_id, position in [("r1", 0), ("unicode-ü", 17), ("x" * 200, 123_456)]:
        expected = str(uuid.uuid5(namespace, f"{run_id}\x00{position}"))
        assert cairn.operation_id(run_id, position) == expected
    assert cairn.operation_id("r1", 0) != cairn.operation_id("r1", 1)
    assert cairn.operation_id("r1", 0) != cairn.operation_id("r2", 0)


def test_run_ids_are_time_ordered_uuid7() -> None:
    ids = [uuid7() for _ in range(200)]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    assert len(set(ids)) == len(ids)
    stamps = [u.int >> 80 for u in ids]
    assert stamps == sorted(stamps)  # millisecond prefix never goes backwards
