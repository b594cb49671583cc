"""A sealed run's values inside its archive: opened so that they compress,
sealed again, to the byte, when the archive is read (issue 26 item 5).

Why: with encryption on, every payload, sealed detail, mailbox payload, run
memory value and approval comment of a run is its own AES-GCM envelope,
bound to its place; ciphertext does not compress, so an archive of the
envelopes as stored was 0.69x of the run's hot bytes. The archive object is
sealed whole (``store.archive``), so what is inside it may be plaintext: each
envelope is stored as its key version, its nonce and its plaintext (the
12-byte header and the 16-byte tag dropped), and zstd then sees the text.

Bit for bit: on read the value is sealed again with the same data key
version, place and nonce, which gives the very envelope that was stored
(AES-GCM is deterministic given them; no new ciphertext is made, so the
nonce is not reused for another message). Archiving checks exactly that for
every value before it stores it opened; one that does not seal back to its
stored bytes (written before encryption, damaged, sealed at a place this
module does not name) is kept as it was stored. So a restore puts back the
rows as they were, each value still opens at its place, and the audit
digests (keyed from the plaintext, ``store.auditkeys``) and links are those
stored.

Erasure: the archive object is sealed with the run's key: its subject's if
it has one (``Sealer.writer``). A value sealed with *another* subject's key
(a memory value written for someone else) is kept as its envelope, never
opened into an archive that this subject's erasure would not shred; so
destroying any subject's key still makes every value of it undecryptable,
archived or not.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import msgspec

from cairn.security.envelope import Place, SealError, header_of, is_envelope, open_sealed, seal
from cairn.store.keysql import SUBJECT_KEY_BASE

Row = tuple[Any, ...]
#: the column of each table whose value is an envelope as stored (bytes)
RAW = {"history": 12, "mailbox": 4, "memory_run": 3}
#: the column of each table whose value is an envelope in base64 text (``SealedStore._seal_text``)
TEXT = {"approvals": 14}
#: history's detail column: JSON whose ``"sealed"`` is an envelope in base64 (``Sealer.seal_json``)
DETAIL = 14
_NONCE = slice(12, 24)
_JSON = msgspec.json.Decoder()


def opened(tenant: str, run_id: str, tables: dict[str, list[Row]], sealer: Any) -> dict[str, list[Row]]:
    """``tables`` with each envelope that seals back to its bytes replaced
    by ``{"v": key version, "n": nonce, "p": plaintext}`` (``"f"``: its
    plaintext compressed in a fitted window, a base64 one with ``"t"``, a
    detail's with ``"j": [the JSON without it, where it was]``)."""
    archive_version = sealer.writer(tenant, run_id)[0]

    def open_one(place: Place, data: Any) -> dict[str, Any] | None:
        if type(data) is not bytes or not is_envelope(data):
            return None
        try:
            head = header_of(data, place)
            if head.key_version >= SUBJECT_KEY_BASE and head.key_version != archive_version:
                return None  # another subject's: stays under its key (erasure)
            cipher = sealer.keys.reader(tenant, head.key_version, place)
            plain = open_sealed(cipher, place, data)
        except SealError:
            return None  # does not open here: kept as stored, and read as stored
        nonce = data[_NONCE]
        # a value sealed under a random nonce since 2026-12-07 was compressed in a window fitted to it
        # (``envelope.compress``), one sealed before (or content-addressed) by ``zlib.compress``:
        # the archive says which seals it back (``"f"``), or it would keep the envelope, which does
        # not compress (0.43x of the run's hot bytes instead of 0.28x). A short value is not
        # compressed either way: it seals back at the first try, unmarked
        if seal(cipher, head.key_version, place, plain, nonce, fitted=False) == data:
            return {"v": head.key_version, "n": nonce, "p": plain}
        if seal(cipher, head.key_version, place, plain, nonce, fitted=True) != data:
            return None
        return {"v": head.key_version, "n": nonce, "p": plain, "f": 1}

    return _mapped(tenant, run_id, tables, open_one)


def resealed(tenant: str, run_id: str, tables: dict[str, list[Row]], sealer: Any) -> dict[str, list[Row]]:
    """``tables`` with every value ``opened`` replaced by its envelope again."""

    def seal_one(place: Place, marker: Any) -> bytes | None:
        if type(marker) is not dict:
            return None
        version, nonce, plain = marker["v"], marker["n"], marker["p"]
        cipher = sealer.keys.reader(tenant, version, place)
        return seal(cipher, int(version), place, bytes(plain), bytes(nonce), fitted=bool(marker.get("f")))

    return _mapped(tenant, run_id, tables, seal_one, back=True)


def holds_opened(tables: dict[str, list[Row]]) -> bool:
    """Whether any value of ``tables`` is an opened one (only a sealed archive may hold them)."""
    columns = [("history", RAW["history"]), ("history", DETAIL), *RAW.items(), *TEXT.items()]
    return any(type(row[column]) is dict for table, column in columns for row in tables.get(table, ()))


def _mapped(tenant: str, run_id: str, tables: dict[str, list[Row]],
            one: Callable[[Place, Any], Any], back: bool = False) -> dict[str, list[Row]]:
    """``tables`` with ``one(place, value)`` put in place of each sealed
    value for which it gives something (``None``: the value kept)."""
    out = dict(tables)
    history: list[Row] = []
    for row in tables.get("history", ()):
        detail = _detail(row[DETAIL], back)
        by_op = isinstance(detail, dict) and detail.get("sealed_at") == "op"
        at = f"op {row[6]}" if by_op else f"seq {row[1]}"
        payload = one(Place(tenant, run_id, "history", at, "payload"), row[RAW["history"]])
        new_detail = _map_detail(row[DETAIL], Place(tenant, run_id, "history", at, "detail"), one, back)
        if payload is not None or new_detail is not None:
            row = (*row[:12], row[12] if payload is None else payload, row[13],
                   row[14] if new_detail is None else new_detail, *row[15:])
        history.append(row)
    if "history" in tables:
        out["history"] = history
    places: dict[str, Callable[[Row], Place]] = {
        "mailbox": lambda r: Place(tenant, run_id, "mailbox", str(r[3]), "payload"),
        "memory_run": lambda r: Place(tenant, run_id, "memory_run", str(r[1]), "value"),
        "approvals": lambda r: Place(tenant, run_id, "approvals", str(r[1]), "comment"),
    }
    for table, place_of in places.items():
        if table not in tables:
            continue
        column = RAW.get(table, TEXT.get(table))
        assert column is not None
        text = table in TEXT
        rows: list[Row] = []
        for row in tables[table]:
            value = row[column]
            if text and not back:
                value = _b64(value)
            new = one(place_of(row), value)
            if new is not None:
                if text and not back:
                    new["t"] = 1
                elif text:
                    new = base64.b64encode(new).decode()
                row = (*row[:column], new, *row[column + 1:])
            rows.append(row)
        out[table] = rows
    return out


def _detail(stored: Any, back: bool) -> Any:
    """A detail's parsed JSON (the template of an opened one), for its ``sealed_at``."""
    if back and type(stored) is dict:
        stored = stored["j"][0]
    if not isinstance(stored, str | bytes) or b"sealed" not in (stored if isinstance(stored, bytes)
                                                               else stored.encode()):
        return None
    try:
        return _JSON.decode(stored)
    except msgspec.DecodeError:
        return None


def _map_detail(stored: Any, place: Place, one: Callable[[Place, Any], Any], back: bool) -> Any:
    if back:
        if type(stored) is not dict:
            return None
        template, index = stored["j"]
        sealed = one(place, stored)
        return str(template[:index]) + base64.b64encode(sealed).decode() + str(template[index:])
    parsed = _detail(stored, back)
    encoded = parsed.get("sealed") if isinstance(parsed, dict) else None
    if not isinstance(stored, str) or not isinstance(encoded, str):
        return None
    index = stored.find(f'"{encoded}"')
    if index < 0 or stored.find(encoded, index + 1 + len(encoded)) >= 0:
        return None
    marker = one(place, _b64(encoded))
    if marker is None:
        return None
    marker["j"] = [stored[:index + 1] + stored[index + 1 + len(encoded):], index + 1]
    return marker


def _b64(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
