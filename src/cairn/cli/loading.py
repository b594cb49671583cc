"""Finding the user's ``App`` from ``--app`` and the database from ``--db``.

The user's module builds its ``App`` at import time, usually as
``cairn.App()`` reading ``$CAIRN_DB``. That is why ``--db`` is applied to the
environment *before* the import: it is the only way to reach an App that has
not been created yet without asking every project to grow a factory.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import click

from cairn.api.app import App
from cairn.api.operator import Operator, cli_actor, open_for_inspection
from cairn.codec.payloads import PayloadCodec
from cairn.errors import CairnError, ConfigError, StoreError
from cairn.store import resolve_url, sqlite_path


class AppLoadError(CairnError):
    """The ``--app`` module exists but failed while being imported."""


def apply_db(db: str | None) -> None:
    """Make ``--db`` the database of every ``cairn.App()`` created from now on."""
    if db is not None:
        os.environ["CAIRN_DB"] = db


def same_database(a: str, b: str) -> bool:
    """Whether two URLs name one database: ``sqlite:///x.db``, ``x.db`` and
    ``sqlite:////abs/x.db`` may all be the same file."""
    try:
        file_a, file_b = sqlite_path(a), sqlite_path(b)
    except ConfigError:  # a malformed URL names no file; only the same text is the same database
        return a == b
    if file_a is not None and file_b is not None:
        return file_a.resolve() == file_b.resolve()
    return a == b


def require_database(db: str | None) -> None:
    """Refuse, as ``App(create=False)`` does, a database file that does
    not exist: for commands that load an App (which would create it) only to
    inspect or operate on runs already in it."""
    path = sqlite_path(resolve_url(db))
    if path is not None and not path.exists():
        raise StoreError(f"no database at {str(path)!r}")


def _check_spec(spec: str) -> tuple[str, str]:
    module_name, sep, attr = spec.partition(":")
    parts = [*module_name.split("."), *attr.split(".")]
    if not sep or not all(part.isidentifier() for part in parts):
        raise click.BadParameter(f"expected 'package.module:app', got {spec!r}", param_hint="'--app'")
    return module_name, attr


def _import(module_name: str) -> object:
    # Like ``python -m``: modules next to where the command runs are importable,
    # even when the ``cairn`` script lives in a virtualenv's bin directory.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise click.BadParameter(f"no module named {module_name!r} (run from the directory that "
                                     "contains it, or install it)", param_hint="'--app'") from None
        raise AppLoadError(f"cannot import {module_name!r}: {exc}") from None
    except CairnError:
        raise  # e.g. the App in the module could not open its database: already one clear line
    except Exception as exc:
        raise AppLoadError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True, slots=True)
class LoadedApp:
    """An App found through ``--app``, and whether this command owns it.

    The command owns the App when it imported the module itself; it then
    closes the App and forgets the module when done, so that calling the CLI
    again in the same process (tests, notebooks) imports it afresh with the
    new ``--db``. An App someone else imported first is theirs to close.
    """

    app: App
    module: str
    owned: bool

    def close(self) -> None:
        if self.owned:
            self.app.close()
            sys.modules.pop(self.module, None)


def load_app(spec: str, db: str | None) -> LoadedApp:
    """Import ``package.module:attribute`` and return the ``cairn.App`` it names.

    Errors are one line each: a malformed spec or a missing module is a usage
    error; a module that blows up while importing is a runtime error.
    """
    module_name, attr = _check_spec(spec)
    apply_db(db)
    owned = module_name not in sys.modules
    target = _import(module_name)
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise click.BadParameter(f"module {module_name!r} has no attribute {attr!r}",
                                     param_hint="'--app'") from None
    if not isinstance(target, App):
        raise click.BadParameter(f"{spec!r} is a {type(target).__name__}, not a cairn.App",
                                 param_hint="'--app'")
    loaded = LoadedApp(target, module_name, owned)
    if db is not None and target.db_url is not None and not same_database(target.db_url, db):
        # The App chose its own database in code; using it would silently read
        # or write somewhere other than the --db the user asked for.
        loaded.close()
        raise click.UsageError(f"--db is {db!r} but app {spec!r} is bound to {target.db_url!r} "
                               "(build it with cairn.App() to let --db choose)")
    return loaded


@dataclass(frozen=True, slots=True)
class Session:
    """What an inspection or operator command works with: the App (the
    ``--app`` one, or a bare App on the database: reading and operating on
    runs needs no workflow code), and the operator acting for the person at
    the command line. The session, not the caller, closes the App."""

    app: App
    operator: Operator
    db_url: str

    @property
    def codec(self) -> PayloadCodec:
        """How stored payloads are read (see ``cairn.codec.payloads``)."""
        return self.app.runtime.payloads


@contextlib.contextmanager
def open_session(db: str | None, app_spec: str | None, *, read_only: bool = False) -> Iterator[Session]:
    """Open the database for commands that only read or operate on runs.

    Without ``--app`` a bare App is opened on the database: inspecting runs
    needs no workflow code, so ``cairn show`` works on any machine that has
    the file. A database that does not exist is an error, never created: a
    typo in ``--db`` must not leave an empty database behind.

    ``read_only`` (the inspection commands): the bare App's store is opened
    read-only (``open_for_inspection``): a reader never waits for a worker's
    write lock and never migrates; pending migrations are one line on
    stderr. (An ``--app`` module builds its own App, which opens as it is
    written to.)
    """
    if app_spec is not None:
        if db is not None:  # the App would create it; an App bound in code is checked by load_app
            require_database(db)
        loaded = load_app(app_spec, db)
        try:
            app = loaded.app
            yield Session(app, app.operator.acting_as(cli_actor()), app.db_url or resolve_url(db))
        finally:
            loaded.close()
        return
    if read_only:
        store, notice = open_for_inspection(db)
        if notice is not None:
            click.echo(notice, err=True)
        bare = App(store=store)
    else:
        bare = App(db, create=False)
    try:
        yield Session(bare, bare.operator.acting_as(cli_actor()), resolve_url(db))
    finally:
        bare.close()


@contextlib.contextmanager
def loaded_app(spec: str, db: str | None) -> Iterator[App]:
    loaded = load_app(spec, db)
    try:
        yield loaded.app
    finally:
        loaded.close()
