"""``bench.encryption``'s floor and layer probes measure what they say: ``bare_aes``
makes an off app's store encrypt each value a 3-step run stores (five a run), and
keeps the plaintext; ``layer_calls`` makes one run's sealing calls on a sealed
store over a stub, sealing each value and writing nothing. Nothing is timed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from bench.encryption import _StubInner, bare_aes, layer_calls, make

from cairn.security.envelope import MAGIC, Place


class Counting:
    """A stand-in cipher that records what it is asked to encrypt."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    def encrypt(self, nonce: bytes, data: bytes, associated: bytes) -> bytes:
        assert len(nonce) == 12
        assert len(associated) == 64
        self.values.append(bytes(data))
        return data + bytes(16)


def _stored(path: Path) -> tuple[bytes, bytes, list[bytes]]:
    with sqlite3.connect(path) as conn:
        run_id, data, result = conn.execute(
            "SELECT run_id, input, result FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()
        steps = [bytes(p) for (p,) in conn.execute(
            "SELECT payload FROM history WHERE run_id = ? AND event = 'step.completed' ORDER BY seq",
            (run_id,))]
    return bytes(data), bytes(result), steps


def test_the_bare_app_encrypts_the_five_values_of_a_run_and_stores_them_plain(tmp_path: Path) -> None:
    path = tmp_path / "bare.db"
    app, _, three = make(path, False)
    try:
        app.run(three)
        cipher = Counting()
        bare_aes(app, cipher)
        assert app.run(three) == 3
        data, result, steps = _stored(path)
        assert cipher.values == [data, *steps, result]  # input, three results, result: in that order
        assert steps == [b'"' + b"x" * 100 + b'"'] * 3
        assert result == b"3"
        assert data[0] != MAGIC
        bare_aes(app)  # the real cipher: the run still completes, its values still plain
        assert app.run(three) == 3
        assert _stored(path)[2] == steps
    finally:
        app.close()


def test_the_layer_calls_seal_each_value_at_its_place_and_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "on.db"
    app, _, three = make(path, True)
    try:
        app.run(three)
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT count(*) FROM history").fetchone()
        one = layer_calls(app)
        store: Any = app.store
        stub = store._hot[-1]
        assert isinstance(stub, _StubInner)
        seen: list[tuple[str, bytes]] = []
        stub.append = lambda run_id, epoch, events, barrier=False: seen.extend(  # type: ignore[method-assign]
            (f"seq {e.seq}", e.payload.data) for e in events)
        stub.finish_run = lambda run_id, epoch, event, status, result, error: seen.append(  # type: ignore[method-assign]
            ("result", result.data))
        one()
        assert [p for p, _ in seen] == ["seq 4", "seq 5", "seq 6", "result"]
        run_id = "r" + "0" * 28
        for position, sealed in seen:
            at = (Place("default", run_id, "history", position, "payload") if position != "result"
                  else Place("default", run_id, "runs", "-", "result"))
            assert sealed[0] == MAGIC
            assert store.sealer.open(at, sealed) in (b'"' + b"x" * 100 + b'"', b"3")
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM history").fetchone() == rows  # nothing written
    finally:
        app.close()
