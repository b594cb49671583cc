"""The SQL literals ``cairn.store.pgliterals`` renders for the LangGraph writes
sent as one simple query (``PostgresStore._lg_operate``, through ``_lg_binder``),
read by a real PostgreSQL server: every value of the types they pass comes back
exactly (and as psycopg's own binding returns it); hostile strings in every
position write what they hold and nothing else; a connection where a
backslash escapes (``standard_conforming_strings`` off) or whose encoding is
not UTF8 gets psycopg's binding; what ``bind`` does not render (NUL in text,
other types, a name missing, other placeholders) gets psycopg's result or error;
and the statements of a real LangGraph run bind to the same values with the
same types as psycopg's ``mogrify``, their effect read back."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cairn
from cairn.store import pgliterals, postgres
from cairn.store.pgliterals import Unrenderable, bind, literal
from tests.engine.conftest import postgres_url

#: pieces that mean something to a SQL string, an array literal, psycopg's placeholders, or
#: whitespace rules; joined at random into strings (plus arbitrary text)
PIECES = ["'", "''", '"', "\\", "\\\\", "\\'", "{", "}", ",", " ", "NULL", "null", "", "\n", "\r\n", "\t",
          "\x01", "\x7f", "\u00a0", "\u3000", "\u2028", "é", "😀", "\U0010fffd", "$$", "E'", "%", "%%",
          "%(x)s", "--", "/*", "*/", ";", "x", "::text", "ARRAY[", "\\x41"]
TEXT = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=8).map("".join),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20))
#: psycopg's cast of a list of int, by its largest magnitude (types/array.py)
INT_BOUNDS = [0, 1, -1, 2**15 - 1, 2**15, -(2**15), -(2**15) - 1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1,
              2**63 - 1, -(2**63)]
HOSTILE = [  # the first: a whole statement as the first column where a backslash escapes the quote
    "\\', NULL, NULL, NULL); DROP TABLE sentinel; --", "'); DROP TABLE sentinel; --",
    "\\'); DROP TABLE sentinel; --", "x\\'", "\\", "'", "''", "\\\\'", "'||(SELECT 'pwn')||'",
    '"}\'::text[]; DROP TABLE sentinel; --',
    '"},{"', "\\\"'); DROP TABLE sentinel; --", "$$; DROP TABLE sentinel; $$", "*/ DROP TABLE sentinel; /*",
    "\\x27); DROP TABLE sentinel; --", "%(b)s", "%s", "E'\\''"]


@pytest.fixture(scope="module")
def conn(pg_admin_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_admin_url, autocommit=True) as connection:
        assert connection.info.parameter_status("standard_conforming_strings") == "on"
        yield connection


def _mogrified(conn: psycopg.Connection[Any], value: Any) -> str:
    return psycopg.ClientCursor(conn).mogrify("%(v)s", {"v": value})


def _selected(conn: psycopg.Connection[Any], literals: list[str]) -> tuple[Any, ...]:
    """What ``SELECT <literals>`` returns, sent as a simple query (as the writes are)."""
    cursor = psycopg.ClientCursor(conn)
    cursor.execute("SELECT " + ", ".join(literals))
    row = cursor.fetchone()
    assert row is not None
    return tuple(row)


def _bound_by_psycopg(conn: psycopg.Connection[Any], values: list[Any], casts: list[str]) -> tuple[Any, ...]:
    """What the server returns for ``values`` bound by psycopg as parameters (extended protocol)."""
    row = conn.execute("SELECT " + ", ".join(f"%s{c}" for c in casts), values).fetchone()
    assert row is not None
    return tuple(row)


# -- round trips ---------------------------------------------------------------------------


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(TEXT, min_size=1, max_size=6),
       elements=st.lists(st.one_of(st.none(), TEXT), max_size=6))
def test_text_and_text_arrays_come_back_exactly(conn: psycopg.Connection[Any], values: list[str],
                                                elements: list[str | None]) -> None:
    got = _selected(conn, [*map(literal, values), literal(elements) + "::text[]"])
    assert got == (*values, elements)
    assert got == _bound_by_psycopg(conn, [*values, elements], [""] * len(values) + ["::text[]"])
    # where psycopg needs no E'' string (no backslash), the text is its very own
    for value in values:
        if "\\" not in value:
            assert literal(value) == _mogrified(conn, value)


def test_bytes_of_every_value_come_back_exactly(conn: psycopg.Connection[Any]) -> None:
    every = bytes(range(256))
    values: list[Any] = [every, every[::-1], b"", b"\x00", b"'", b"\\", b"\\x00", bytearray(every[:40]),
                         memoryview(every)[10:20], b"'); DROP TABLE sentinel; --" * 3]
    elements: list[Any] = [every, None, b"", b"\x00\\\"'{},", b"NULL", None, bytes([92, 120, 48, 48])]
    got = _selected(conn, [*map(literal, values), literal(elements), literal([]) + "::bytea[]",
                           literal([None]) + "::bytea[]"])
    assert got == (*map(bytes, values), elements, [], [None])
    assert got[:len(values) + 1] == _bound_by_psycopg(conn, [*values, elements], [""] * (len(values) + 1))
    for value in values:  # the scalar's text is psycopg's own
        assert literal(value) == _mogrified(conn, value)


def test_ints_and_bools_at_their_bounds_come_back_exactly_with_psycopgs_types(
        conn: psycopg.Connection[Any]) -> None:
    scalars: list[Any] = [*INT_BOUNDS, True, False, None]
    arrays: list[list[Any]] = [[b] for b in INT_BOUNDS] + [
        [1, None, -1], [None, 2**15], [-(2**15) - 1, 0], [2**31, -(2**31) - 1], [-(2**63), 2**63 - 1, None]]
    got = _selected(conn, [*map(literal, scalars), *map(literal, arrays),
                           literal([None, None]) + "::bigint[]", literal([]) + "::bigint[]"])
    assert got == (*scalars, *arrays, [None, None], [])
    # a negative int keeps its space: "1-%(x)s" is 1 - (-1), not 1 and a comment
    assert _selected(conn, [bind("1-%(x)s", {"x": -1})]) == (2,)
    for value in [*scalars, *arrays, [None, None], []]:  # the same text: the same types, the same casts
        assert literal(value) == _mogrified(conn, value), value
    # and int8's bounds bind to bigint (psycopg: int8), out of it psycopg's numeric
    typed = [f"pg_typeof({literal(2**63 - 1)})::text", f"pg_typeof({literal([2**40])})::text"]
    assert _selected(conn, typed) == ("bigint", "bigint[]")


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ints=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=6),
       blobs=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=6))
def test_int_and_bytea_arrays_come_back_exactly(conn: psycopg.Connection[Any], ints: list[int | None],
                                                blobs: list[bytes | None]) -> None:
    got = _selected(conn, [literal(ints) + "::bigint[]", literal(blobs) + "::bytea[]"])
    assert got == (ints, blobs) == _bound_by_psycopg(conn, [ints, blobs], ["::bigint[]", "::bytea[]"])
    if any(i is not None for i in ints):
        assert literal(ints) == _mogrified(conn, ints)


# -- what bind leaves to psycopg ----------------------------------------------------------------


def test_nul_in_text_is_refused_as_psycopg_refuses_it(conn: psycopg.Connection[Any]) -> None:
    binder = postgres._lg_binder(conn)
    for value in ["a\x00b", "\x00", ["ok", "a\x00"], [None, "\x00"]]:
        with pytest.raises(Unrenderable):
            literal(value)
        with pytest.raises(psycopg.DataError, match="NUL"):
            binder("SELECT %(v)s", {"v": value})
    # bytes may hold NUL: they go as hex
    assert _selected(conn, [literal(b"a\x00b")]) == (b"a\x00b",)


def test_what_bind_does_not_render_gets_psycopgs_own_result_or_error(conn: psycopg.Connection[Any]) -> None:
    binder = postgres._lg_binder(conn)

    def outcome(call: Any, query: str, params: dict[str, Any]) -> Any:
        try:
            return call(query, params)
        except Exception as exc:
            return type(exc), str(exc)

    mogrify = psycopg.ClientCursor(conn).mogrify
    cases: list[tuple[str, dict[str, Any]]] = [
        ("SELECT %(x)s, %(y)s", {"x": 1}),  # a name missing: ProgrammingError
        ("SELECT %(x)s, %s", {"x": 1}), ("SELECT %(x)b", {"x": 1}), ("SELECT %(x)t", {"x": "a"}),
        ("SELECT 100%", {"x": 1}), ("SELECT 1 % (2)", {}), ("SELECT %(x)\n", {"x": 1}),
        ("SELECT %(x", {"x": 1}),
        ("SELECT %(x)s", {"x": 1.5}), ("SELECT %(x)s", {"x": 2**63}), ("SELECT %(x)s", {"x": -(2**63) - 1}),
        ("SELECT %(x)s", {"x": [2**63]}), ("SELECT %(x)s", {"x": ["a", 1]}), ("SELECT %(x)s", {"x": [[1]]}),
        ("SELECT %(x)s", {"x": [True]}), ("SELECT %(x)s", {"x": (1, 2)}), ("SELECT %(x)s", {"x": {"a": 1}}),
        ("SELECT %(x)s", {"x": [b"a", "b"]}), ("SELECT %(x)s", {"x": memoryview(b"abcd")[::2]}),
    ]
    for query, params in cases:
        expected = outcome(mogrify, query, params)
        assert outcome(binder, query, params) == expected, (query, params)
        with pytest.raises(Unrenderable):  # bind itself declined: psycopg rendered it or refused it
            bind(query, params)


def test_placeholders_read_as_psycopg_reads_them(conn: psycopg.Connection[Any]) -> None:
    params = {"x": "%(y)s%%", "y": "no", "a%b": 7, "z": None}
    for query in ["SELECT %(x)s, %(y)s", "SELECT 7 %% 4, '%%', %(a%b)s, '%%(x)s'", "SELECT %(z)s, '%%'",
                  "SELECT 1"]:
        ours = bind(query, params)
        assert _selected(conn, [ours[len("SELECT "):]]) == _selected(
            conn, [psycopg.ClientCursor(conn).mogrify(query, params)[len("SELECT "):]])
    # a value is never read for placeholders: "%(y)s%%" stays itself
    assert bind("SELECT %(x)s", params) == "SELECT '%(y)s%%'"


def test_a_lone_surrogate_fails_as_with_mogrify(conn: psycopg.Connection[Any]) -> None:
    text = bind("SELECT %(x)s", {"x": "a\ud800"})  # psycopg fails to encode it when it sends it
    with pytest.raises(UnicodeEncodeError):
        psycopg.ClientCursor(conn).execute(text)
    with pytest.raises(UnicodeEncodeError):
        psycopg.ClientCursor(conn).mogrify("SELECT %(x)s", {"x": "a\ud800"})


# -- injection -------------------------------------------------------------------------------


def _sink(url: str, **options: Any) -> psycopg.Connection[Any]:
    connection = psycopg.connect(url, autocommit=True, **options)
    connection.execute("CREATE TABLE IF NOT EXISTS sentinel (n int)")
    connection.execute("CREATE TABLE IF NOT EXISTS sink (n bigserial, a text, b text[], c bytea[], d bytea)")
    connection.execute("TRUNCATE sink")
    return connection


_INSERT = "INSERT INTO sink (a, b, c, d) VALUES (%(a)s, %(b)s::text[], %(c)s::bytea[], %(d)s)"


def _inject_everywhere(connection: psycopg.Connection[Any], bytea_arrays: bool = True) -> None:
    """Each hostile string as the scalar, first, middle and last of the array,
    and as bytes, each row written in a simple query of its own by
    ``_lg_binder``; all come back, and the sentinel table stands.
    ``bytea_arrays=False``: arrays of bytes are not compared (psycopg 3.3.9
    renders them wrong where standard_conforming_strings is off: ``b"'"`` comes
    back as the 4 characters ``\\x27``)."""
    binder = postgres._lg_binder(connection)
    rows = []
    for bad in HOSTILE:
        for b in ([bad], [bad, "x", None], ["x", bad, "y"], [None, "x", bad], [bad, bad]):
            row = (bad, b, [bad.encode(), None], bad.encode())
            rows.append(row)
            psycopg.ClientCursor(connection).execute(
                binder(_INSERT, {"a": row[0], "b": row[1], "c": row[2], "d": row[3]}) + "; SELECT 1")
    assert connection.execute("SELECT to_regclass('sentinel') IS NOT NULL").fetchone() == (True,)
    kept = (0, 1, 2, 3) if bytea_arrays else (0, 1, 3)
    written = connection.execute("SELECT a, b, c, d FROM sink ORDER BY n").fetchall()
    assert [tuple(r[i] for i in kept) for r in written] == [tuple(r[i] for i in kept) for r in rows]


def test_hostile_strings_in_every_position_write_what_they_hold(pg_url: str) -> None:
    with _sink(pg_url) as connection:
        _inject_everywhere(connection)
        # bind's own text, not psycopg's: this is the path under test
        assert postgres._lg_binder(connection)("%(a)s", {"a": "\\"}) == "'\\'"


def test_where_a_backslash_escapes_psycopg_binds(pg_url: str) -> None:
    # standard_conforming_strings off: in '...' a backslash escapes the next character,
    # and "x\'" in a standard string ends it early: only psycopg's E'' strings hold
    off = "-c standard_conforming_strings=off -c escape_string_warning=off"
    with _sink(pg_url, options=off) as connection:
        assert connection.info.parameter_status("standard_conforming_strings") == "off"
        _inject_everywhere(connection, bytea_arrays=False)


def test_a_connection_not_in_utf8_gets_psycopgs_binding(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True, client_encoding="LATIN1") as connection:
        params = {"a": "é\\'", "b": ["é\\\"", None]}
        query = "SELECT %(a)s, %(b)s::text[]"
        assert postgres._lg_binder(connection)(query, params) == psycopg.ClientCursor(connection).mogrify(
            query, params)
        assert _selected(connection, [postgres._lg_binder(connection)(query, params)[len("SELECT "):]]) == (
            "é\\'", ["é\\\"", None])


# -- the real statements ---------------------------------------------------------------------


#: a placeholder of a statement and the cast the statement gives it
_PLACED = re.compile(r"%\((\w+)\)s((?:::\w+(?:\[\])?)?)")


def test_a_langgraph_run_binds_each_value_as_psycopg_does(pg_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph on a thread whose id (and node name) hold hostile characters: its
    writes bind through ``pgliterals`` (recorded), every parameter as the
    statement casts it selects the same type and value as psycopg's
    ``mogrify`` renders it, and the graph reads back what it wrote."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from cairn.langgraph import CairnSaver

    class State(TypedDict):
        n: int
        said: list[str]

    node = "t'a\"l\\k {x},NULL"
    thread = "th'); DROP TABLE sentinel; --\\\"{,}"
    recorded: list[tuple[str, Any]] = []
    binder = postgres._lg_binder

    def recording(connection: Any) -> Any:
        bind = binder(connection)

        def recorded_bind(query: str, params: Any) -> str:
            recorded.append((query, params))
            return bind(query, params)
        return recorded_bind

    monkeypatch.setattr(postgres, "_lg_binder", recording)
    rendered: list[str] = []
    real = pgliterals.bind

    def rendering(query: str, params: Any) -> str:
        text = real(query, params)
        rendered.append(text)
        return text

    monkeypatch.setattr(pgliterals, "bind", rendering)

    def talk(state: State) -> dict[str, Any]:
        return {"n": state["n"] + 1, "said": [*state["said"], f"it's \\ {state['n']} \"{{}}\""]}

    builder = StateGraph(State)
    builder.add_node(node, talk)
    builder.add_edge(START, node)
    builder.add_conditional_edges(node, lambda s: END if s["n"] >= 6 else node, [node, END])
    app = cairn.App(db=postgres_url(pg_url))
    try:
        saver = CairnSaver(app, tenant="acme")
        graph = builder.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": thread}}
        final = graph.invoke({"n": 0, "said": []}, config)
        assert final["n"] == 6
        assert len(final["said"]) == 6
        assert graph.get_state(config).values == final
        assert len(list(graph.get_state_history(config))) == 8
    finally:
        app.close()

    names = {" ".join(q.split()[:3]) for q, _ in recorded}
    assert len(names) >= 5, names  # lg_hold, the values, the writes, the checkpoint, the fold...
    assert len(rendered) == len(recorded)  # every statement by pgliterals, none left to psycopg
    with psycopg.connect(pg_url, autocommit=True) as connection:
        mogrify = psycopg.ClientCursor(connection).mogrify
        for query, params in recorded:
            placed = [(m.group(1), m.group(2)) for m in _PLACED.finditer(query)]
            assert placed, query
            ours = [literal(params[n]) + cast for n, cast in placed]
            theirs = [mogrify("%(v)s", {"v": params[n]}) + cast for n, cast in placed]
            typed = [f"pg_typeof({x})::text" for x in ours + theirs]
            row = _selected(connection, [*ours, *theirs, *typed])
            k = len(placed)
            assert row[:k] == row[k:2 * k], query
            assert row[2 * k:3 * k] == row[3 * k:], query
