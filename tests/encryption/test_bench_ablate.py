"""``bench.encryption --ablate`` takes each piece of sealing out of one app
(``take_out``): what it reports as a piece's cost is worth something only if
the piece is really gone and the run still completes. Checked here on the
stored rows and the store's caches; nothing is timed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from bench.encryption import PIECES, _AesStandIn, _DigestStandIn, make, take_out

from cairn.security.envelope import MAGIC, TAG_SIZE


def _row(path: Path) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]]:
    """The last run's stored input and result, and its step entries' payloads and digests, raw (the
    sealed store would refuse to open what a stand-in wrote)."""
    with sqlite3.connect(path) as conn:
        run_id, data, result = conn.execute(
            "SELECT run_id, input, result FROM runs ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
        steps = conn.execute(
            "SELECT payload, digest FROM history WHERE run_id = ? AND event = 'step.completed' ORDER BY seq",
            (run_id,),
        ).fetchall()
    return bytes(data), bytes(result), [(bytes(p), bytes(d)) for p, d in steps]


@pytest.mark.parametrize("piece", PIECES)
def test_a_piece_taken_out_is_gone_and_the_run_completes(tmp_path: Path, piece: str) -> None:
    path = tmp_path / "x.db"
    app, _, three = make(path, True)
    try:
        app.run(three)  # the tenant's key made and cached, as the bench warms up
        take_out(app, piece)
        assert app.run(three) == 3
        store: Any = app.store
        data, result, steps = _row(path)
        sealed = {"input": data[0] == MAGIC, "result": result[0] == MAGIC}
        assert len(steps) == 3
        if piece == "aes":  # an envelope's shape, the stand-in's zero tag in place of AES-GCM's
            assert all(type(c[1]) is _AesStandIn for c in store.keys.writing.values())
            assert sealed == {"input": True, "result": True}
            assert all(p[0] == MAGIC and p.endswith(bytes(TAG_SIZE)) for p, _ in steps)
        elif piece == "digest":
            assert all(type(k) is _DigestStandIn for k in store.audit_keys.keyed.values())
            assert [d for _, d in steps] == [_DigestStandIn.DIGEST] * 3
        else:  # the value stored as given, the other one still sealed
            assert sealed == {"input": piece != "input", "result": piece != "result"}
        if piece != "aes":  # the others keep the real cipher: no step payload ends in a zero tag
            assert not any(p.endswith(bytes(TAG_SIZE)) for p, _ in steps)
    finally:
        app.close()


def test_an_unknown_piece_is_refused_in_one_line(tmp_path: Path) -> None:
    app, _, _ = make(tmp_path / "x.db", True)
    try:
        with pytest.raises(SystemExit, match="--ablate: one of aes, digest, input, result, not 'zlib'"):
            take_out(app, "zlib")
    finally:
        app.close()
