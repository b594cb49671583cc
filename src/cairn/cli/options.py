"""What every ``cairn`` command shares: the group classes that turn errors
into one line and give a group a default command, and the ``--db`` and
``--app`` options."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
from rich.console import Console

from cairn.errors import CairnError, ConfigError
from cairn.store import sqlite_path

from .terminal import SafeConsole, clean

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = "Database URL (sqlite:///path.db, sqlite:////abs/path.db or a file path). Default: $CAIRN_DB, " \
          "then ./.cairn/cairn.db."


#: click >= 8.2 raises this for a bare ``cairn``; older versions print the help themselves.
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _fail(message: str, code: int) -> int:
    click.echo(f"error: {clean(message, newlines=False)}", err=True)
    return code


def _usage_line(exc: click.UsageError) -> str:
    message = exc.format_message().rstrip(".")
    if exc.ctx is not None:
        message += f" (see '{exc.ctx.command_path} --help')"
    return message


class CairnGroup(click.Group):
    """A click group whose errors are one line on stderr, never a traceback
    or click's multi-line usage block: the CLI is also used from scripts,
    where one line per failure is what ends up in a log."""

    def main(  # type: ignore[override]
        self,
        args: list[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except _NO_ARGS_IS_HELP as exc:  # bare `cairn`: the help, as click does
            click.echo(exc.format_message(), err=True)
            code = 2
        except click.UsageError as exc:
            code = _fail(_usage_line(exc), 2)
        except click.ClickException as exc:
            code = _fail(exc.format_message(), exc.exit_code)
        except click.Abort:  # Ctrl-C while click itself was prompting or parsing
            code = 130
        except CairnError as exc:
            code = _fail(str(exc), 1)
        if not standalone_mode:
            return code
        sys.exit(code)


def db_from_context(ctx: click.Context, db: str | None) -> str | None:
    """``--db`` given on the command, else on the nearest group that has one
    (``cairn --db X ops resolve``), else ``None`` (``$CAIRN_DB``, then the default)."""
    parent = ctx.parent
    while db is None and parent is not None:
        db = parent.params.get("db")
        parent = parent.parent
    return db


db_option = click.option("--db", metavar="URL", default=None, help=DB_HELP)


def app_option(required: bool) -> Callable[[F], F]:
    extra = "" if required else " Optional: only to take the database from the app."
    return click.option("--app", "app_spec", metavar="MODULE:APP", required=required,
                        help=f"Import path of your cairn.App, e.g. myproject.agents:app.{extra}")


def database_label(url: str) -> str:
    """The database ``url`` names, said so that two commands can be seen to
    share one: a SQLite file as its absolute path (``sqlite:///.cairn/cairn.db``
    is relative to where each command runs, so a ``start`` and a ``worker``
    in different directories silently use two databases), any other URL
    without its password."""
    try:
        path = sqlite_path(url)
    except ConfigError:
        path = None
    if path is not None:
        return f"SQLite {path.resolve()}"
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}{port}"))


def served_database(db_url: str | None) -> str:
    """Which database an App on ``db_url`` works on, for the worker's banner
    and ``start`` (``None``: an App built on a store object, not a URL)."""
    if db_url is None:
        return "the store the app was built with"
    return database_label(db_url)


def stdout_console() -> Console:
    return SafeConsole()


def stderr_console() -> Console:
    return SafeConsole(stderr=True)


class DefaultCommandGroup(click.Group):
    """A group that runs its ``default`` command when the first argument
    names none of its commands: ``cairn ops RUN`` is ``cairn ops list RUN``,
    while ``cairn ops resolve ...`` still reaches ``resolve``."""

    def __init__(self, *args: Any, default: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default = default

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        i = 0
        while i < len(args):  # skip the group's own options
            if args[i] in ctx.help_option_names:
                return super().parse_args(ctx, args)
            if args[i] == "--db":
                i += 2
            elif args[i].startswith("--db="):
                i += 1
            else:
                break
        if i >= len(args) or args[i] not in self.commands:
            args = [*args[:i], self.default, *args[i:]]
        return super().parse_args(ctx, args)
