"""SQL run on a saver's database as its owner, behind the saver's back
(``?`` placeholders on both backends): how the tests read what is stored
and plant damaged or hostile rows."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg


def raw_sql(db_url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows read, or changed, by ``statement`` (none for a statement that returns none)."""
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            return conn.execute(statement, params).fetchall()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET search_path = cairn")
        cursor = conn.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description is not None else []
