"""SQL run on a saver's database as its owner, behind the saver's back
(``?`` placeholders on both backends): how the tests read what is stored
and plant damaged or hostile rows. PostgreSQL stores checkpoint ids packed
(migrations 0049, 0050): a statement names an id as ``lg_id_key(?)`` and
reads one as ``lg_id_text(checkpoint_id)``; on SQLite, where ids are text,
both return their argument."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg


def raw_sql(db_url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows read, or changed, by ``statement`` (none for a statement that returns none)."""
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.create_function("lg_id_key", 1, lambda v: v, deterministic=True)
            conn.create_function("lg_id_text", 1, lambda v: v, deterministic=True)
            return conn.execute(statement, params).fetchall()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET search_path = cairn")
        cursor = conn.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description is not None else []
