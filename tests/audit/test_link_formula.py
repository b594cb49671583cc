"""The chain's hashing as the hot path computes it, against the documented
formula recomputed here with ``hashlib`` and ``msgspec`` alone (issue 26;
store/auditlinks.py): an entry's digest and link by CPython's own SHA-256
for the writers up to 8 blocks of input (one block for ``digest``) and
OpenSSL's beyond, its link from a tuple written out item by item. A slip
in either (a wrong threshold, an item left out or swapped, an int time
not encoded as the float the column returns) gives other bytes than the
formula, which the verifier would call tampering."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest

from cairn.store import auditlinks

_ENCODE = msgspec.msgpack.Encoder(order="sorted").encode


def formula_digest(data: bytes | None, detail: dict[str, Any] | None) -> bytes:
    return hashlib.sha256(_ENCODE([data, detail])).digest()


def formula_link(previous: bytes, values: tuple[Any, ...], entry_digest: bytes) -> bytes:
    meta = [*values[:12], values[13]]
    meta[3] = float(meta[3])
    meta[11] = None if meta[11] is None else float(meta[11])
    return hashlib.sha256(previous + _ENCODE([*meta, entry_digest])).digest()


def values_of(at: float | int, started: float | int | None, data: bytes | None,
              ref: str | None = None) -> tuple[Any, ...]:
    """A row in ``rows.EVENT_COLUMNS`` order."""
    return ("run-1", 7, "step.completed", at, 2, "worker-a", 5, "step", "inc", "0123abcd", 1, started, data,
            ref, None)


@pytest.mark.parametrize("detail", [None, {"b": 1, "a": "x"}])
def test_digest_and_link_follow_the_formula_across_the_one_block_boundary(detail: Any) -> None:
    previous = bytes(range(32))
    # input lengths from a few bytes to several blocks: the one-block hash up to 55 bytes, OpenSSL's
    # beyond; the writers' (``chained``) CPython's up to 503 bytes (8 blocks), OpenSSL's beyond
    for size in [*range(0, 80), 119, 120, 183, *range(490, 510), 1000]:
        data = bytes([size % 251]) * size
        values = values_of(1.5e9 + size / 7, 1.5e9, data)
        expected = formula_digest(data, detail)
        expected_link = formula_link(previous, values, expected)
        assert auditlinks.digest(data, detail) == expected, size
        assert auditlinks.chained(previous, values, data, detail) == expected_link, size
        assert auditlinks.digest_and_link(previous, values, data, detail) == (expected, expected_link), size
        assert auditlinks.row_link(previous, values, expected) == expected_link, size
        assert auditlinks.written_link(previous, values, expected) == expected_link, size


def test_links_follow_the_formula_across_the_writers_boundary() -> None:
    """The link's own input (the previous link and the body) from below to
    above the 503 bytes the writers hash with CPython's SHA-256 (a long
    payload reference makes it long), times as floats and as ints."""
    previous = bytes(range(32))
    lengths = set()
    for size in range(300, 420):
        for at, started in ((1.5e9 + size, 1.5e9), (1_500_000_000 + size, None)):
            values = values_of(at, started, b"42", ref="r" * size)
            d = formula_digest(b"42", None)
            expected = formula_link(previous, values, d)
            assert auditlinks.chained(previous, values, b"42", None) == expected, size
            assert auditlinks.written_link(previous, values, d) == expected, size
            assert auditlinks.row_link(previous, values, d) == expected, size
            as_float = [*values[:12], values[13]]
            as_float[3], as_float[11] = float(at), None if started is None else float(started)
            lengths.add(len(previous) + len(auditlinks.body(as_float, d)))
    assert min(lengths) < auditlinks._WRITTEN_MAX < max(lengths)


def test_an_entry_without_payload_or_detail_has_the_empty_digest() -> None:
    values = values_of(1.5e9, None, None)
    empty = formula_digest(None, None)
    assert auditlinks.digest(None, None) == empty
    expected = formula_link(auditlinks.GENESIS, values, empty)
    assert auditlinks.chained(auditlinks.GENESIS, values, None, None) == expected


@pytest.mark.parametrize(("at", "started"), [(1_500_000_000, None), (1_500_000_000, 1_499_999_999),
                                             (1.5e9, 1_499_999_999), (1_500_000_000, 1.4e9)])
def test_int_times_link_as_the_floats_the_column_returns(at: Any, started: Any) -> None:
    """A caller's clock may give ints; REAL / float8 columns give floats back."""
    values = values_of(at, started, b"42", ref="artifact-1")
    as_read = values_of(float(at), None if started is None else float(started), b"42", ref="artifact-1")
    d = formula_digest(b"42", None)
    expected = formula_link(bytes(32), as_read, d)
    assert auditlinks.chained(bytes(32), values, b"42", None) == expected
    assert auditlinks.row_link(bytes(32), values, d) == expected
    assert auditlinks.row_link(bytes(32), as_read, d) == expected
    assert auditlinks.written_link(bytes(32), values, d) == expected
