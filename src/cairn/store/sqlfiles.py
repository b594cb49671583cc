"""Load SQL kept in ``.sql`` files beside the backends.

SQL lives in files (one ``queries.sql`` of ``-- name: x`` blocks and ordered
``migrations/NNNN_*.sql`` per dialect) so it can be read, diffed and reviewed
as SQL, and so every dialect offers the same query names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(dialect: str) -> dict[str, str]:
    """Return ``{name: sql}`` from ``sql/<dialect>/queries.sql``."""
    text = resources.files("cairn.store").joinpath("sql", dialect, "queries.sql").read_text("utf-8")
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        # Indentation left out: psycopg parses a statement's placeholders once
        # and caches the result only for statements of at most 4,096 bytes
        # (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``); a longer one is
        # parsed again at every execution (~40 us of client CPU for
        # ``lg_read_one``: issue 24, 2026-12-07). No statement here has a
        # string literal spanning lines, whose text this would change.
        lines = [ln.lstrip() for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip()
    return queries


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(dialect: str) -> list[Migration]:
    """Migrations of ``dialect`` in version order (file names ``NNNN_name.sql``)."""
    folder = resources.files("cairn.store").joinpath("sql", dialect, "migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number, _, rest = entry.name.partition("_")
            found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations of {dialect} are not numbered 1..n: {[m.version for m in found]}")
    return found
