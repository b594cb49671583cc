"""Identifiers.

Run ids are UUIDv7 (RFC 9562): time-ordered, so new runs land at the right
edge of every B-tree keyed by run id (the runs table and the history, which
is clustered by run id). Random v4 ids scatter those inserts over the whole
tree and cost several times more page writes per commit.
"""

from __future__ import annotations

import os
import time
import uuid


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48 bits of Unix milliseconds, then 74 random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a: 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b: 62 bits
    return uuid.UUID(int=value)


def new_run_id() -> str:
    return str(uuid7())
