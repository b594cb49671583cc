"""The chain's hashing as the hot path computes it, against the documented
formula recomputed here with ``hashlib`` and ``msgspec`` alone (issue 26;
store/auditlinks.py): an entry's plain digest by SHA-256 (CPython's own for
one block, OpenSSL's beyond) and, for a link of version 3, by BLAKE2b; its
link from a tuple written out item by item, of version 3 (BLAKE2b over the
BLAKE2b digest, 0x03 before it) as the writers compute it without a
keyring, of version 2 (BLAKE2b over a given digest, 0x02) with one, and of
each version as the verifier recomputes it from the version the stored link
declares. A slip
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


def formula_body(values: tuple[Any, ...], entry_digest: bytes) -> bytes:
    meta = [*values[:12], values[13]]
    meta[3] = float(meta[3])
    meta[11] = None if meta[11] is None else float(meta[11])
    return _ENCODE([*meta, entry_digest])


def formula_link_v1(previous: bytes, values: tuple[Any, ...], entry_digest: bytes) -> bytes:
    return hashlib.sha256(previous + formula_body(values, entry_digest)).digest()


def formula_link(previous: bytes, values: tuple[Any, ...], entry_digest: bytes) -> bytes:
    """Version 2, what the writers store given a digest (a keyring's)."""
    return b"\x02" + hashlib.blake2b(previous + formula_body(values, entry_digest), digest_size=32,
                                     person=b"cairn link 2").digest()


def formula_digest_v3(data: bytes | None, detail: dict[str, Any] | None) -> bytes:
    return hashlib.blake2b(_ENCODE([data, detail]), digest_size=32, person=b"cairn digest 3").digest()


def formula_link_v3(previous: bytes, values: tuple[Any, ...], entry_digest: bytes) -> bytes:
    """Version 3, what the writers store without a keyring (over ``formula_digest_v3``)."""
    return b"\x03" + hashlib.blake2b(previous + formula_body(values, entry_digest), digest_size=32,
                                     person=b"cairn link 3").digest()


def recomputed(previous: bytes, values: tuple[Any, ...], entry_digest: bytes) -> tuple[bytes, bytes, bytes]:
    """The verifier's links of every version, each as the version it is asked for."""
    return (auditlinks.row_link(previous, values, entry_digest, 1),
            auditlinks.row_link(previous, values, entry_digest, 2),
            auditlinks.row_link(previous, values, entry_digest, 3))


def values_of(at: float | int, started: float | int | None, data: bytes | None,
              ref: str | None = None) -> tuple[Any, ...]:
    """A row in ``rows.EVENT_COLUMNS`` order."""
    return ("run-1", 7, "step.completed", at, 2, "worker-a", 5, "step", "inc", "0123abcd", 1, started, data,
            ref, None)


@pytest.mark.parametrize("detail", [None, {"b": 1, "a": "x"}])
def test_digest_and_link_follow_the_formula_across_the_one_block_boundary(detail: Any) -> None:
    previous = bytes(range(32))
    # input lengths from a few bytes to several blocks: the one-block hash up to 55 bytes, OpenSSL's
    # beyond; BLAKE2b's 128-byte blocks for version 3's digest
    for size in [*range(0, 80), 119, 120, 127, 128, 129, 183, 255, 256, 257, *range(490, 510), 1000]:
        data = bytes([size % 251]) * size
        values = values_of(1.5e9 + size / 7, 1.5e9, data)
        expected = formula_digest(data, detail)
        expected_link = formula_link(previous, values, expected)
        expected_v3 = formula_digest_v3(data, detail)
        expected_link_v3 = formula_link_v3(previous, values, expected_v3)
        assert auditlinks.digest(data, detail) == expected, size
        assert auditlinks.digest_v3(data, detail) == expected_v3, size
        assert [auditlinks.plain_digest(data, detail, v) for v in (1, 2, 3)] == [expected, expected,
                                                                                 expected_v3], size
        assert auditlinks.written_link(previous, values, None, data, detail) == expected_link_v3, size
        assert auditlinks.digest_and_link(previous, values, data, detail) == (expected, expected_link), size
        assert recomputed(previous, values, expected) == (formula_link_v1(previous, values, expected),
                                                          expected_link,
                                                          formula_link_v3(previous, values, expected)), size
        assert auditlinks.row_link(previous, values, expected_v3, 3) == expected_link_v3, size
        assert auditlinks.written_link(previous, values, expected) == expected_link, size


def test_links_follow_the_formula_across_blocks() -> None:
    """The link's own input (the previous link, of either version's length,
    and the body) over BLAKE2b's and SHA-256's block boundaries (a long
    payload reference makes it long), times as floats and as ints."""
    lengths = set()
    for previous in (bytes(range(32)), b"\x02" + bytes(range(32))):
        for size in range(60, 420):
            for at, started in ((1.5e9 + size, 1.5e9), (1_500_000_000 + size, None)):
                values = values_of(at, started, b"42", ref="r" * size)
                d = formula_digest(b"42", None)
                expected = formula_link(previous, values, d)
                d3 = formula_digest_v3(b"42", None)
                expected_v3 = formula_link_v3(previous, values, d3)
                assert auditlinks.written_link(previous, values, None, b"42", None) == expected_v3, size
                assert auditlinks.written_link(previous, values, d) == expected, size
                v1 = formula_link_v1(previous, values, d)
                v3_of_d = formula_link_v3(previous, values, d)
                assert recomputed(previous, values, d) == (v1, expected, v3_of_d), size
                assert auditlinks.row_link(previous, values, d3, 3) == expected_v3, size
                lengths.add(len(previous) + len(formula_body(values, d)))
    assert min(lengths) < 256 < 512 < max(lengths)  # BLAKE2b's 128-byte blocks, SHA-256's 64


def test_a_stored_link_says_its_version_and_nothing_else_matches() -> None:
    """32 bytes is version 1, 33 starting 0x02 version 2, 0x03 version 3; any
    other length or first byte is no version, whose recomputation
    (``PENDING``) matches no stored link, so a forged label cannot pick a
    check of its own."""
    assert auditlinks.link_version(bytes(32)) == 1
    assert auditlinks.link_version(b"\x02" + bytes(32)) == 2
    assert auditlinks.link_version(b"\x03" + bytes(32)) == 3
    for stored in (b"", bytes(31), b"\x01" + bytes(32), b"\x04" + bytes(32), bytes(33), b"\x02" + bytes(33),
                   b"\x03" + bytes(33), bytes(64)):
        assert auditlinks.link_version(stored) == 0, stored
    values = values_of(1.5e9, None, b"42")
    assert auditlinks.row_link(bytes(32), values, bytes(32), 0) == auditlinks.PENDING


def test_an_entry_without_payload_or_detail_has_the_empty_digest() -> None:
    values = values_of(1.5e9, None, None)
    empty = formula_digest(None, None)
    assert auditlinks.digest(None, None) == empty
    empty_v3 = formula_digest_v3(None, None)
    assert auditlinks.digest_v3(None, None) == empty_v3
    expected = formula_link_v3(auditlinks.GENESIS, values, empty_v3)
    assert auditlinks.written_link(auditlinks.GENESIS, values, None, None, None) == expected


@pytest.mark.parametrize(("at", "started"), [(1_500_000_000, None), (1_500_000_000, 1_499_999_999),
                                             (1.5e9, 1_499_999_999), (1_500_000_000, 1.4e9)])
def test_int_times_link_as_the_floats_the_column_returns(at: Any, started: Any) -> None:
    """A caller's clock may give ints; REAL / float8 columns give floats back."""
    values = values_of(at, started, b"42", ref="artifact-1")
    as_read = values_of(float(at), None if started is None else float(started), b"42", ref="artifact-1")
    d = formula_digest(b"42", None)
    expected = formula_link(bytes(32), as_read, d)
    d3 = formula_digest_v3(b"42", None)
    expected_v3 = formula_link_v3(bytes(32), as_read, d3)
    assert auditlinks.written_link(bytes(32), values, None, b"42", None) == expected_v3
    assert auditlinks.row_link(bytes(32), values, d3, 3) == expected_v3
    assert auditlinks.row_link(bytes(32), values, d, 2) == expected
    assert auditlinks.row_link(bytes(32), as_read, d, 2) == expected
    assert auditlinks.row_link(bytes(32), values, d, 1) == formula_link_v1(bytes(32), as_read, d)
    assert auditlinks.written_link(bytes(32), values, d) == expected
