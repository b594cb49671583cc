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


@pytest.mark.parametrize("every", [2, 4])
def test_with_tails_every_base_is_a_row_and_on_the_spine(every: int) -> None:
    """``next_base(spine, every)`` (``cairn.langgraph.TAIL``): a version that
    is not a multiple of ``every`` is stored against the last multiple, a
    multiple against ``j - lowbit(j)``: every base is a multiple (a row), the
    spine has it exactly, and a chain of rows stays about log2 long."""
    from cairn.langgraph import next_base

    spine: tuple[tuple[int, str, int], ...] = ((0, "v0", 0),)
    depth = {0: 0}
    for j in range(1, 5000):
        index, (base_index, _, count), kept = next_base(spine, every)
        assert index == j
        expected = j - j % every if j % every else j - (j & -j)
        assert base_index == expected == count, (j, base_index)
        assert base_index % every == 0
        if j % every == 0:
            depth[j] = depth[base_index] + 1
            assert depth[j] <= (j // every).bit_length(), (j, depth[j])
        spine = ((j, f"v{j}", j), *kept)
