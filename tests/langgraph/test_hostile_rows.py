"""Rows ``CairnSaver`` must refuse, on both backends: a damaged checkpoint, a
value holding a pickle or a msgpack constructor outside the allowlist (the
``__reduce__`` style: "call this with these arguments"). Each read raises
``UnreadableCheckpoint`` naming the checkpoint, never returns ``None`` or a
default, and executes nothing (the payloads would create a directory)."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

import cairn
from cairn.errors import InvalidArgument, UnreadableCheckpoint

if TYPE_CHECKING:
    from cairn.langgraph import CairnSaver


@dataclasses.dataclass
class Point:
    """A user type: not in LangGraph's safe list, so it needs an allowlist entry."""

    x: int
    y: int


class Evil:
    """Unpickling this would run ``os.mkdir(path)``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _execute(db_url: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    """Change rows behind the saver's back (an attacker, a damaged disk)."""
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(statement, params)
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET search_path = cairn")
        conn.execute(statement.replace("?", "%s"), params)


def _saved(app: cairn.App, value: Any, **kwargs: Any) -> tuple[CairnSaver, Any]:
    """A saver and the config of a checkpoint whose channel ``c`` holds ``value``."""
    from langgraph.checkpoint.base import empty_checkpoint

    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme", **kwargs)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"c": value}
    checkpoint["channel_versions"] = {"c": "1"}
    config = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint,
                       {"source": "input", "step": -1}, {"c": "1"})
    return saver, config


def _constructor_payload(module: str, name: str, args: list[Any]) -> bytes:
    """LangGraph's msgpack encoding of "construct ``module.name(*args)``"."""
    import ormsgpack
    from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_POS_ARGS

    return ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_POS_ARGS, ormsgpack.packb([module, name, args])))


def test_a_damaged_checkpoint_is_refused_naming_it(app: cairn.App, db_url: str) -> None:
    saver, config = _saved(app, "fine")
    checkpoint_id = config["configurable"]["checkpoint_id"]
    _execute(db_url, "UPDATE lg_checkpoints SET checkpoint = ?", (b"\xc1\xff damaged",))
    with pytest.raises(UnreadableCheckpoint, match=f"checkpoint '{checkpoint_id}' of thread 't'"):
        saver.get_tuple(config)
    with pytest.raises(UnreadableCheckpoint, match=checkpoint_id):
        list(saver.list(None))


def test_a_value_that_is_not_stored_is_refused_not_defaulted(app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import CairnSaver

    saver, config = _saved(app, ["a", "b"])
    _execute(db_url, "DELETE FROM lg_values")
    with pytest.raises(UnreadableCheckpoint, match="channel 'c' names a value that is not stored"):
        CairnSaver(app, tenant="acme").get_tuple(config)  # a reader that holds nothing of the thread
    # the saver that wrote the list holds its items, by digest: it reads them
    # without fetching the values, so what it returns is what it stored
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"]["c"] == ["a", "b"]


def test_a_pickle_row_is_refused_and_not_run(app: cairn.App, db_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Evil(str(marker)))
    saver, config = _saved(app, "fine, and a row")  # longer than a literal (checkpointsql.literal)
    _execute(db_url, "UPDATE lg_values SET kind = 'pickle', data = ?", (payload,))
    with pytest.raises(UnreadableCheckpoint, match="refused its channel 'c': serializer type 'pickle'"):
        saver.get_tuple(config)
    assert not marker.exists()
    # a serializer that pickles is refused, LangGraph's fallback or a custom one
    from langgraph.checkpoint.serde.base import SerializerCompat

    class Pickler:
        def dumps(self, obj: Any) -> bytes:
            return pickle.dumps(obj)

        def loads(self, data: bytes) -> Any:
            return pickle.loads(data)  # what the saver must never reach

    with pytest.raises(InvalidArgument, match="never uses pickle"):
        _saved(app, "x", serde=_pickle_fallback())
    with pytest.raises(InvalidArgument, match="never stores pickles"):
        _saved(app, "x", serde=SerializerCompat(Pickler()))
    # and a custom serializer is never handed a pickled row, whatever its type says
    json_saver, json_config = _saved(app, {"fine": 1}, serde=SerializerCompat(Json()))
    assert json_saver.get_tuple(json_config) is not None
    _execute(db_url, "UPDATE lg_values SET data = ?", (payload,))
    with pytest.raises(UnreadableCheckpoint, match="a pickle payload"):
        json_saver.get_tuple(json_config)
    assert not marker.exists()


def test_a_serializer_type_that_is_empty_is_refused_and_nothing_is_stored(app: cairn.App) -> None:
    """An empty type is what marks SQLite's pending rows (a checkpoint's
    writes put before the checkpoint): a serializer returning one is refused
    in one line, so no checkpoint can be taken for a pending row and skipped."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    class Untyped(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return "", super().dumps_typed(obj)[1]

    with pytest.raises(InvalidArgument, match=r"^CairnSaver needs a serializer type: .* empty one$"):
        _saved(app, "x", serde=Untyped(allowed_msgpack_modules=None))
    from cairn.langgraph import CairnSaver

    assert CairnSaver(app, tenant="acme").get_tuple({"configurable": {"thread_id": "t",
                                                                      "checkpoint_ns": ""}}) is None


class Json:
    """A custom (untyped) serializer: plain JSON."""

    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


def _pickle_fallback() -> Any:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    return JsonPlusSerializer(pickle_fallback=True)


def test_a_constructor_outside_the_allowlist_is_refused_and_not_run(
    app: cairn.App, db_url: str, tmp_path: Path
) -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    marker = tmp_path / "pwned"
    payload = _constructor_payload("os", "mkdir", [str(marker)])
    # the payload is live: LangGraph's serializer allowing every module runs it
    JsonPlusSerializer(allowed_msgpack_modules=True).loads_typed(("msgpack", payload))
    assert marker.exists()
    marker.rmdir()
    saver, config = _saved(app, "fine, and a row")  # longer than a literal (checkpointsql.literal)
    _execute(db_url, "UPDATE lg_values SET data = ?", (payload,))
    refused = r"refused its channel 'c': os\.mkdir is not in the allowlist"
    with pytest.raises(UnreadableCheckpoint, match=refused):
        saver.get_tuple(config)
    assert not marker.exists()
    with pytest.raises(InvalidArgument, match="allowlist"):
        _saved(app, "x", serde=JsonPlusSerializer(allowed_msgpack_modules=True))


def test_an_allowlisted_copy_reads_the_type_and_the_original_still_refuses(app: cairn.App) -> None:
    saver, config = _saved(app, Point(1, 2))
    with pytest.raises(UnreadableCheckpoint, match=re.escape(f"{__name__}.Point is not in the allowlist")):
        saver.get_tuple(config)
    allowed = saver.with_allowlist([(__name__, "Point")])
    got = allowed.get_tuple(config)
    assert got is not None
    assert got.checkpoint["channel_values"]["c"] == Point(1, 2)
    with pytest.raises(UnreadableCheckpoint, match="not in the allowlist"):
        saver.get_tuple(config)
    # the same through the constructor's allowlist
    from cairn.langgraph import CairnSaver

    direct = CairnSaver(app, tenant="acme", allowlist=[(__name__, "Point")])
    found = direct.get_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"]["c"] == Point(1, 2)


@pytest.mark.parametrize("prefix", ["zd1:", "zlib:"])
def test_a_compressed_row_that_does_not_inflate_is_refused_naming_it(
        app: cairn.App, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """A long value is stored compressed (type ``zd1:<type>``: raw DEFLATE
    with the saver's dictionary; ``zlib:<type>`` before migration 0030 /
    0043); a damaged one, a truncated one, or one inflating beyond the limit
    (a "zip bomb" written behind the saver's back) is an
    ``UnreadableCheckpoint`` naming the checkpoint, and a compressed pickle
    is still a pickle: refused."""
    import zlib

    import cairn.langgraph as lg

    def deflated(data: bytes) -> bytes:
        if prefix == lg.ZLIB:
            return zlib.compress(data)
        deflate = zlib.compressobj(1, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict=lg.ZDICT_1)
        return deflate.compress(data) + deflate.flush()

    text = " ".join(f"word{n % 50}" for n in range(300))
    saver, config = _saved(app, text)
    checkpoint_id = config["configurable"]["checkpoint_id"]
    _execute(db_url, "UPDATE lg_values SET kind = ?, data = ? "
             "WHERE coalesce(kind, 'zd1:msgpack') = 'zd1:msgpack'",
             (f"{prefix}msgpack", b"\xff\xff damaged"))
    stored = f"SET data = ? WHERE kind = '{prefix}msgpack'"
    with pytest.raises(UnreadableCheckpoint, match=f"checkpoint '{checkpoint_id}' of thread 't': cannot "
                                                   "decompress its channel 'c'"):
        saver.get_tuple(config)
    whole = deflated(b"\xa5hello" * 1000)
    _execute(db_url, f"UPDATE lg_values {stored}", (whole[:-6],))
    with pytest.raises(UnreadableCheckpoint, match="it is truncated or inflates beyond"):
        saver.get_tuple(config)
    monkeypatch.setattr(lg, "INFLATE_LIMIT", 4096)
    _execute(db_url, f"UPDATE lg_values {stored}", (whole,))
    with pytest.raises(UnreadableCheckpoint, match="inflates beyond 4,096 bytes"):
        saver.get_tuple(config)
    monkeypatch.undo()
    marker = tmp_path / "pwned"
    _execute(db_url, f"UPDATE lg_values SET kind = '{prefix}pickle', data = ? WHERE kind = '{prefix}msgpack'",
             (deflated(pickle.dumps(Evil(str(marker)))),))
    with pytest.raises(UnreadableCheckpoint, match="serializer type 'pickle'"):
        saver.get_tuple(config)
    assert not marker.exists()
