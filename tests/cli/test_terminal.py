"""The outlet every CLI string passes through (``cairn.cli.terminal``)."""

from __future__ import annotations

import io
import json
import logging

from rich.table import Table

from cairn.cli.terminal import CleanFormatter, SafeConsole, clean, json_text

HOSTILE = "[/INST] [bold red]x[/] \x1b]8;;https://evil\x1b\\link\x1b]8;;\x1b\\ \x9b2J \u202e \x00\x7f"


def test_clean_shows_control_characters_as_escapes() -> None:
    assert clean("a\x1b[31mb\x07\nc\td") == "a\\x1b[31mb\\x07\nc\td"
    assert clean("a\nb\tc", newlines=False) == "a\\x0ab\\x09c"
    assert clean("\u202eevil\u2066") == "\\u202eevil\\u2066"
    assert clean("héllo 日本 🙂") == "héllo 日本 🙂"  # ordinary text is untouched


def test_safe_console_prints_markup_literally_and_no_control_from_data() -> None:
    out = io.StringIO()
    console = SafeConsole(file=out, width=200, force_terminal=True, color_system="truecolor")
    table = Table()
    table.add_column("cell")
    table.add_row(HOSTILE)
    console.print(HOSTILE)
    console.print(table)
    text = out.getvalue()
    assert "[/INST] [bold red]x[/]" in text
    assert "evil" in text
    # the only escape sequences are the console's own SGR styling
    for raw in ("\x1b]", "\x9b", "\u202e", "\x00", "\x7f", "\x1b\\"):
        assert raw not in text


def test_json_text_stays_valid_json_with_the_same_value() -> None:
    value = {"k": HOSTILE}
    text = json_text(json.dumps(value, ensure_ascii=False))
    assert "\x9b" not in text
    assert "\u202e" not in text
    assert json.loads(text) == value


def test_log_lines_are_cleaned() -> None:
    record = logging.LogRecord("cairn.worker", logging.WARNING, __file__, 1, "run %s failed: %s",
                               ("r1", f"boom {HOSTILE}"), None)
    line = CleanFormatter("%(message)s").format(record)
    assert "\x1b" not in line
    assert "\\x1b]8;;https://evil" in line
