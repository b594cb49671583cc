"""Finding the SQLite library to register sqlite-vec with costs no process:
``ctypes.util.find_library`` runs ``ldconfig -p``, which every worker paid
when it opened its store (where Python cannot load extensions itself)."""

from __future__ import annotations

import ctypes
import sqlite3
import subprocess
from typing import Any

import pytest

from cairn.store import sqlitevec


def test_the_library_sqlite3_runs_on_is_found_without_a_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        started.append(args)
        raise AssertionError("a subprocess was started to find libsqlite3")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    name = sqlitevec._loaded_sqlite()
    assert started == []
    lib = ctypes.CDLL(name)
    lib.sqlite3_libversion.restype = ctypes.c_char_p
    assert lib.sqlite3_libversion().decode() == sqlite3.sqlite_version
