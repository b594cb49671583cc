"""``cairn.langgraph.next_base``: the version a list's next version is stored
against (a Fenwick tree's parent), checked by walking every chain it makes."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed")


def test_every_chain_reaches_the_root_in_log2_rows_against_a_prefix() -> None:
    from cairn.langgraph import next_base

    spine: tuple[tuple[int, str, int], ...] = ((0, "v0", 0),)
    base_of: dict[str, str | None] = {"v0": None}
    items_of = {"v0": 0}
    for j in range(1, 5000):
        index, (base_index, base, count), kept = next_base(spine)
        assert index == j
        assert base_index == j - (j & -j), (j, base_index)
        assert count == items_of[base] <= j  # a prefix of what the version holds (one item a version)
        version = f"v{j}"
        base_of[version], items_of[version] = base, j
        spine = ((j, version, j), *kept)
        assert len(spine) <= j.bit_length() + 1, spine
        rows, at = 0, version
        while at is not None:  # the rows a read walks: the version, its base, ... the root
            rows, at = rows + 1, base_of[at]
        assert rows == bin(j).count("1") + 1, (j, rows)
