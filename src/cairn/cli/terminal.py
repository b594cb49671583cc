"""Everything the CLI prints goes through here, because most of what it prints
is somebody else's text.

Run inputs and results, tenant, workflow, queue and tool names, error messages
and worker ids all come from users or from stored data. Printed as they are,
``[/INST]`` crashes rich's markup parser, ``[bold red]`` restyles the output,
and an ESC or OSC sequence reaches the operator's terminal (retitling it,
hiding lines, writing links or worse). So the class is closed at the outlet,
not at each call site:

* the consoles never parse markup in strings (``markup=False``): styles come
  only from ``Text`` spans the CLI builds itself;
* every segment a console renders, and every line ``echo`` writes, has its
  control characters replaced by a visible escape (``\\x1b``), so nothing a
  user stored can act on the terminal, and an operator can still see it was there.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

import click
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

#: C0 controls (except newline and tab), DEL, C1 controls, and the Unicode
#: bidirectional overrides and isolates that make text display in an order
#: other than the one it is stored in.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile(f"[\n\t]|{_CONTROL.pattern}")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: str, *, newlines: bool = True) -> str:
    """``text`` with every control character shown as an escape instead of
    acting on the terminal; ``newlines=False`` also escapes newlines and tabs
    (for one-line fields such as a table cell or a log line)."""
    pattern = _CONTROL if newlines else _CONTROL_OR_NEWLINE
    return pattern.sub(_visible, text)


class SafeConsole(Console):
    """A rich console for untrusted text: no markup, no highlighting, and
    control characters escaped in everything it renders (control segments
    rich itself emits, such as cursor moves, are left alone)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("highlight", False)
        kwargs.setdefault("emoji", False)
        super().__init__(**kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        """Plain strings (table cells among them) are cleaned before they are
        measured, so an escaped control character keeps its column width."""
        kwargs["markup"] = False
        return super().render_str(clean(text), **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not _CONTROL.search(segment.text):
                yield segment
            else:
                yield Segment(clean(segment.text), segment.style)  # a ``Text`` built from user data


def json_text(text: str) -> str:
    """JSON text safe for a terminal: the encoders escape C0 controls but
    leave C1 controls and bidi overrides raw inside strings; those become
    ``\\uXXXX`` escapes, so the JSON stays valid and decodes to the same value."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def echo_json(value: Any, **dumps: Any) -> None:
    """Print ``value`` as JSON (``json.dumps`` options in ``dumps``)."""
    click.echo(json_text(json.dumps(value, **dumps)))


def echo(message: str = "", *, err: bool = False) -> None:
    """``click.echo`` for one line that holds user data: newlines in it are
    escaped too (a newline in a run id or tenant must not forge a line)."""
    click.echo(clean(message, newlines=False), err=err)


class CleanFormatter(logging.Formatter):
    """Log lines (the worker's) carry run errors and ids: cleaned like the
    rest of the output, newlines kept for tracebacks."""

    def format(self, record: logging.LogRecord) -> str:
        return clean(super().format(record))
