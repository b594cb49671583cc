"""sqlite-vec on the store's SQLite connections, wherever this Python allows it.

sqlite-vec is a loadable SQLite extension (the ``sqlite-vec`` package ships
the compiled library). Python's ``sqlite3`` can load extensions only when
the interpreter was built with ``--enable-loadable-sqlite-extensions``;
many are not (pyenv's and python.org's default builds, this project's CI).
So there are two ways in, tried in order:

1. ``Connection.enable_load_extension``: load it into each connection.
2. SQLite's own C API ``sqlite3_auto_extension``, through ctypes, with
   sqlite-vec's entry point: SQLite then initialises sqlite-vec in every
   connection the process opens afterwards. This is the documented way to
   link an extension statically; it needs the ``libsqlite3`` that
   ``_sqlite3`` uses to be a shared library this process can open by name,
   which ``available`` verifies on a scratch connection before relying on it.

Where neither works (a statically linked ``_sqlite3``, no ``sqlite-vec``
wheel for the platform), ``load`` says so and the store scores vectors in
the client instead (``vectorindex``): slower, same answers.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import sqlite3
import threading

log = logging.getLogger("cairn.store")

_lock = threading.Lock()
#: None: not tried yet; else whether every new connection gets sqlite-vec
_auto: bool | None = None


def _has(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT vec_version()").fetchone()
    except sqlite3.Error:
        return False
    return True


def _loaded_sqlite() -> str:
    """The SQLite library ``_sqlite3`` is linked to, as this process mapped
    it (``/proc/self/maps``); else the usual soname. ``ctypes.util.find_library``
    only where neither can be read: it runs ``ldconfig -p`` in a subprocess,
    which every worker process paid at start."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libsqlite3" in path:
                    return path
    except OSError:
        pass
    for name in ("libsqlite3.so.0", "libsqlite3.dylib"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return ctypes.util.find_library("sqlite3") or "libsqlite3.so.0"


def _register_auto_extension() -> bool:
    """Register sqlite-vec with ``sqlite3_auto_extension`` (see the module doc)."""
    try:
        import sqlite_vec  # type: ignore[import-untyped]

        lib = ctypes.CDLL(_loaded_sqlite())
        lib.sqlite3_libversion.restype = ctypes.c_char_p
        if lib.sqlite3_libversion().decode() != sqlite3.sqlite_version:
            return False  # not the library _sqlite3 runs on
        ext = ctypes.CDLL(sqlite_vec.loadable_path() + ".so")
        entry = ctypes.cast(ext.sqlite3_vec_init, ctypes.c_void_p)
        lib.sqlite3_auto_extension.argtypes = [ctypes.c_void_p]
        if lib.sqlite3_auto_extension(entry) != 0:
            return False
    except (ImportError, OSError, AttributeError):
        return False
    scratch = sqlite3.connect(":memory:")
    try:
        return _has(scratch)
    finally:
        scratch.close()


def prepare() -> None:
    """Register the auto extension once per process, where connections
    cannot load extensions themselves; before the store opens any."""
    global _auto
    if hasattr(sqlite3.Connection, "enable_load_extension"):
        return
    with _lock:
        if _auto is None:
            _auto = _register_auto_extension()
            if not _auto:
                log.info("sqlite-vec cannot be loaded by this Python: vectors are scored in the client")


def load(conn: sqlite3.Connection) -> bool:
    """Make sqlite-vec's functions available on ``conn`` (opened after
    ``prepare``); whether they are."""
    if hasattr(conn, "enable_load_extension"):
        with contextlib.suppress(ImportError, sqlite3.Error, AttributeError):
            import sqlite_vec

            conn.enable_load_extension(True)
            try:
                sqlite_vec.load(conn)
            finally:
                conn.enable_load_extension(False)
    return _has(conn)
