"""Store backends behind one contract; ``open_store`` picks one from a URL.

The rules every backend follows are decided once, in ``lifecycle`` (the run
state machine) and ``admission`` (claims); ``rows`` maps rows and builds
parameters for both SQL dialects; ``sqlite`` and ``postgres`` are dialects.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cairn.errors import ConfigError, MissingExtra, StoreError
from cairn.security.envelope import aesgcm
from cairn.security.keyring import Keyring, keyring_from_env
from cairn.store.contract import Migratable, Notifier, Store
from cairn.store.records import Durability

#: Where an App keeps its data when neither ``db=`` nor ``$CAIRN_DB`` says.
DEFAULT_DB = "sqlite:///.cairn/cairn.db"


def resolve_url(db: str | None) -> str:
    return db or os.environ.get("CAIRN_DB") or DEFAULT_DB


def sqlite_path(url: str) -> Path | None:
    """The file a database URL names (``sqlite:///rel.db``, ``sqlite:////abs.db``
    or a plain path); ``None`` when it names no file (``memory://``, other
    schemes). Raises ``ConfigError`` for a malformed SQLite URL."""
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")
        if not path.startswith("/") or path == "/":
            raise ConfigError(f"malformed SQLite URL {url!r}: use sqlite:///relative.db or sqlite:////abs.db")
        path = path[1:]  # sqlite:///x.db -> x.db ; sqlite:////abs/x.db -> /abs/x.db
        if path in ("", ":memory:"):
            raise ConfigError("in-memory SQLite is not supported: use memory:// for a throwaway store")
        return Path(path)
    if "://" in url:
        return None
    if _CONNINFO.match(url):
        raise ConfigError(f"{url[:60]!r} looks like a PostgreSQL connection string, not a file: "
                          "use a URL, postgresql://user@host:port/dbname")
    return Path(url)


#: A libpq keyword/value connection string (``host=... dbname=...``): taken as a
#: plain file path it would silently open a SQLite file of that name.
_CONNINFO = re.compile(r"^\s*(host|hostaddr|port|dbname|user|password|sslmode|service|options)\s*=")


def dialect(db: str | None) -> str:
    """Which backend the URL ``db`` names: ``sqlite``, ``postgres`` or
    ``memory`` (``ConfigError`` for anything else). ``memory://`` opens a
    SQLite store in a temporary directory removed on ``close``; it is
    reported apart because nothing outside the process can reach it (no
    schema to manage, nothing to inspect later)."""
    url = resolve_url(db)
    if url.startswith(("postgresql://", "postgres://")):
        return "postgres"
    if url.startswith("memory://"):
        return "memory"
    if sqlite_path(url) is None:
        scheme = url.split("://", 1)[0]
        raise ConfigError(
            f"unsupported database URL scheme {scheme!r} (supported: sqlite, postgresql, memory)"
        )
    return "sqlite"


def open_store(
    db: str | None = None,
    durability: Durability | str = Durability.PROCESS,
    *,
    create: bool = True,
    migrate: bool = True,
    read_only: bool = False,
    keyring: Keyring | None = None,
) -> Store:
    """Open the store named by ``db`` (``sqlite:///path``, ``memory://``, or a
    plain file path), defaulting to ``$CAIRN_DB`` then ``./.cairn/cairn.db``.
    ``create=False`` refuses to create a missing database (for inspection
    commands, so a typo does not leave an empty database behind).
    ``migrate=False`` leaves the schema as it is (for ``cairn db``, which
    reports and applies migrations itself). ``read_only=True`` (inspection
    commands) implies both: the database is only read, never created or
    migrated, and a SQLite reader never takes the write lock."""
    url = resolve_url(db)
    try:
        mode = Durability(durability)
    except ValueError:
        raise ConfigError(f"unknown durability {durability!r} (use 'process' or 'power')") from None
    kind = dialect(url)
    if read_only:
        create = migrate = False
    keyring = keyring if keyring is not None else keyring_from_env()
    if keyring is not None:
        aesgcm(bytes(32))  # MissingExtra (one line naming it) before anything is opened
    if kind == "postgres":
        store = _open_postgres(url, mode, migrate)
    elif kind == "memory":  # a throwaway SQLite store: gone on close(), or with the process
        from cairn.store.sqlite import throwaway_store

        store = throwaway_store(mode)
    else:
        path = sqlite_path(url)
        assert path is not None
        if not create and not path.exists():
            raise StoreError(f"no database at {str(path)!r}")
        from cairn.store.sqlite import SQLiteStore

        store = SQLiteStore(path, durability=mode, auto_migrate=migrate, read_only=read_only)
    return with_keyring(store, keyring)


def _plaintext_database(store: Store) -> bool:
    """Whether ``store`` holds runs or memory but no data key: written before
    encryption was turned on (a worker given a keyring would park every run
    it claims; ``cairn keys adopt`` seals it first)."""
    inner: Any = store
    try:
        return not inner.data_keys(None) and bool(inner.rekey_page("rekey_tenants_page",
                                                                    {"after": "", "limit": 1}))
    except Exception:  # not a SQL store, or a schema before data_keys (inspection): nothing to say
        return False


def with_keyring(store: Store, keyring: Keyring | None) -> Store:
    """``store`` sealed with ``keyring``; without one, ``store`` itself, unless
    it holds data keys (an encrypted database): then ``ConfigError`` (and
    ``store`` closed), so encrypted rows are never read as plaintext."""
    if getattr(store, "sealed", False):
        return store  # sealed already
    if keyring is not None:
        from cairn.store.sealed import sealed_store

        if _plaintext_database(store):
            store.close()
            raise ConfigError("this database holds data written without encryption: seal it first with "
                              "'cairn keys adopt' (nothing is read as plaintext)")
        return sealed_store(store, keyring)
    keys = getattr(store, "data_keys", None)
    try:
        tenants = {row.tenant for row in keys()} if keys is not None else set()
    except Exception:  # a schema before data_keys (inspecting an old database read-only): none
        tenants = set()
    if tenants:
        store.close()
        raise ConfigError(f"this database is encrypted (data keys of {len(tenants)} tenant(s)): "
                          "give its keyring (App(keyring=...), --keyring, or $CAIRN_KEYRING)")
    return store


def _open_postgres(url: str, mode: Durability, migrate: bool) -> Store:
    """``postgresql://user@host:port/db?schema=name&tenant=acme``: ``schema``
    (default ``cairn``) and ``tenant`` (narrow every connection to one of the
    tenants the role is granted; row-level security holds a role that is not
    the tables' owner to its grants, see ``cairn.store.postgres``) are Cairn's own
    query parameters, removed before libpq sees the URL."""
    try:
        from cairn.store.postgres import PostgresStore
    except MissingExtra:
        raise MissingExtra("PostgreSQL (a postgresql:// database)", "postgres") from None
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {key: value for key, value in query if key in ("schema", "tenant")}
    rest = urlencode([(key, value) for key, value in query if key not in ("schema", "tenant")])
    clean = urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment))
    return PostgresStore(
        clean, durability=mode, schema=ours.get("schema", "cairn"), tenant=ours.get("tenant"),
        auto_migrate=migrate,
    )


__all__ = [
    "DEFAULT_DB", "Migratable", "Notifier", "Store", "dialect", "open_store", "resolve_url", "sqlite_path",
    "with_keyring",
]
