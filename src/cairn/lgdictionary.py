"""Compression dictionaries made of a LangGraph thread's own values.

A ``CairnSaver`` stores each message of a thread once, as a value row,
DEFLATEd with a preset dictionary of what LangGraph's rows spell
(``cairn.langgraph.ZDICT_1``). That dictionary holds the envelope of a
message, not its words: the bench graph's 1 KB messages took ~636 bytes each
(issue 24: PostgreSQL's bytes on disk at 3,000 super-steps were 1.41x the
logical bytes, the target 1.3x). A dictionary made of the thread's own first
~31 KB of values also holds the words its messages share, and took them to
~484 (``bench.value_dictionary``).

How a thread's dictionary is made, stored and read:

* A saver collects the serialized bytes of the long values it writes to a
  thread, and of those it reads from it, until it has ``source_bytes``
  (with the preset dictionary in front, they fill DEFLATE's 32 KB window but
  for a message's room). It then takes the thread's first stored dictionary
  if there is one (two savers of one thread then share it) or makes its own
  of them.
* The dictionary is a row of the thread's values (kind ``KIND``) under the
  digest of its bytes, which it holds DEFLATEd with the preset dictionary
  (the bench graph's 31 KB in ~16 KB: PostgreSQL's own TOAST compression
  left them at ~31), sent by the first write whose values use it, in the
  same transaction, and by any write after the saver forgot the thread: the
  rule every value row follows (``CairnSaver._unstored``), so it is never
  missing when a value naming it commits.
* A value compressed with it is stored as a ``ZDICT`` value whose bytes start
  with ``MARK`` and the dictionary's digest. ``MARK`` is a DEFLATE block of
  type 3, which no stream has: no value stored before reads differently.
* A reader fetches a dictionary it does not hold by its digest and checks
  that digest against the bytes before inflating with them, so a damaged or
  substituted row is refused, never decoded into other text.
* Collection (a prune, ``delete_for_runs``) keeps a thread's dictionaries
  while it keeps any of the thread's values: nothing names them in
  ``refs``, but values do in their bytes; ``delete_thread`` deletes them with the thread, and
  ``copy_thread`` copies them with its values.

None is made when the store seals: a dictionary of plaintext values beside
their ciphertext would give away what sealing hides. A sealing saver still
reads those made before (``cairn keys adopt`` seals them, dictionaries
included, and the saver opens a dictionary's row as it opens a value's).
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cairn.security.envelope import deflate_raw
from cairn.store.checkpointsql import ValueRow

#: the first byte of a value compressed with a thread's dictionary: a DEFLATE
#: block header of type 3 (reserved), which no DEFLATE stream starts with
MARK = b"\x06"
#: the kind of a dictionary's row of ``lg_values``: never a value's (``KNOWN_TYPES``)
KIND = "lgdict"
#: DEFLATE's window: the preset dictionary and the value it primes share it
WINDOW = 32768
#: room left in the window for the value itself
ROOM = 1024
#: threads whose dictionary (or the bytes it is being made of: at most ~31 KB
#: each, and ~48 KB once made) a saver keeps: a saver writing more threads than
#: this in turn, one value each, makes none for them (their values are
#: compressed with the preset dictionary alone, as before)
THREADS = 256
#: bytes of a value compressed with a dictionary before its stream: ``MARK`` and the digest
HEADER = 1 + 8
#: a dictionary's row is DEFLATEd at this level (once a thread, ~31 KB: a few milliseconds)
LEVEL = 9

#: a dictionary's digest -> (its digest, its bytes) stored for the thread, or
#: with ``None`` the thread's first stored dictionary (``SQLCheckpoints.lg_dictionary``)
Find = Callable[[str, "int | None"], "tuple[int, bytes] | None"]


@dataclass(frozen=True, slots=True)
class Dictionary:
    """A thread's dictionary: its digest, what DEFLATE is primed with (the
    preset dictionary, then the thread's bytes), its row, and the header of
    the values compressed with it."""

    digest: int
    zdict: bytes
    row: ValueRow
    header: bytes


class Dictionaries:
    """One saver's thread dictionaries: those it writes with, made or
    adopted per thread, and those it read with, by (thread, digest). Both
    are bounded (``THREADS``); thread-safe."""

    def __init__(self, preset: bytes, digest_of: Callable[[str, bytes], int], find: Find,
                 *, making: bool = True) -> None:
        #: whether this saver makes dictionaries (not when its store seals), or only reads them
        self.making = making
        self._preset = preset
        self._digest_of = digest_of
        self._find = find
        self.source_bytes = WINDOW - ROOM - len(preset)
        self._lock = threading.Lock()
        #: per thread: the bytes its dictionary is being made of, or the dictionary
        self._writing: OrderedDict[str, bytearray | Dictionary] = OrderedDict()
        self._reading: OrderedDict[tuple[str, int], Dictionary] = OrderedDict()

    def pack(self, thread_id: str, data: bytes, level: int = 1) -> tuple[bytes, ValueRow] | None:
        """``data`` (a long value's serialized bytes) compressed with the
        thread's dictionary, and the dictionary's row, which must be stored
        with it; ``None`` while the thread has none yet (``data`` then counts
        towards making it) or when it does not save ``HEADER`` bytes, or
        when this saver makes none (``making``)."""
        if not self.making:
            return None
        made = self._for_writing(thread_id, data)
        if made is None:
            return None
        small = deflate_raw(data, level, made.zdict)
        if len(small) + HEADER >= len(data):
            return None
        return made.header + small, made.row

    def inflater(self, thread_id: str, data: bytes) -> tuple[zlib._Decompress, bytes] | None:
        """For a ``ZDICT`` value's bytes: an inflater primed with the thread's
        dictionary they name and the stream after their header, or ``None``
        when they name none (``MARK`` absent). A dictionary that is not
        stored for the thread, or whose bytes are not its digest's, raises
        ``LookupError``."""
        if data[:1] != MARK:
            return None
        if len(data) < HEADER:
            raise LookupError("its compression dictionary's digest is cut short")
        digest = int.from_bytes(data[1:HEADER], "little", signed=True)
        return zlib.decompressobj(-15, zdict=self._for_reading(thread_id, digest).zdict), data[HEADER:]

    # -- inside ---------------------------------------------------------------------------

    def learn(self, thread_id: str, values: Sequence[bytes]) -> None:
        """Long values read from the thread (serialized), towards its
        dictionary as the values this saver writes are: a thread whose savers
        each write a little of it (a run resumed by a new execution every
        turn, each execution a new saver that reads the thread first) still
        gets one once it holds enough."""
        if not self.making:
            return
        with self._lock:
            held = self._held(thread_id)
            for data in values:
                if isinstance(held, Dictionary) or len(held) >= self.source_bytes:
                    return
                held += data[:self.source_bytes - len(held)]

    def _held(self, thread_id: str) -> bytearray | Dictionary:
        """The thread's dictionary, or the bytes it is being made of (under ``_lock``)."""
        held = self._writing.get(thread_id)
        if held is None:
            held = self._writing[thread_id] = bytearray()
            while len(self._writing) > THREADS:
                self._writing.popitem(last=False)
        else:
            self._writing.move_to_end(thread_id)
        return held

    def _for_writing(self, thread_id: str, data: bytes) -> Dictionary | None:
        with self._lock:
            held = self._held(thread_id)
            if isinstance(held, Dictionary):
                return held
            held += data[:self.source_bytes - len(held)]
            if len(held) < self.source_bytes:
                return None
            source = bytes(held)
        try:  # a dictionary another saver (or this one, before) made
            stored = self._find(thread_id, None)
        except LookupError:  # one that does not open: this saver makes its own
            stored = None
        made = None if stored is None else self._checked(thread_id, *stored)
        if made is None:
            made = self._made(source)
        with self._lock:
            self._writing[thread_id] = made
            self._writing.move_to_end(thread_id)
            self._keep(thread_id, made)
        return made

    def _for_reading(self, thread_id: str, digest: int) -> Dictionary:
        with self._lock:
            held = self._reading.get((thread_id, digest))
            if held is not None:
                self._reading.move_to_end((thread_id, digest))
                return held
        stored = self._find(thread_id, digest)
        if stored is None:
            raise LookupError(f"its compression dictionary {digest} is not stored")
        made = self._checked(thread_id, *stored)
        if made is None or made.digest != digest:
            raise LookupError(f"its compression dictionary {digest} is damaged (its bytes are not "
                              "its digest's)")
        with self._lock:
            self._keep(thread_id, made)
        return made

    def _checked(self, thread_id: str, digest: int, stored: bytes) -> Dictionary | None:
        """The stored dictionary, or ``None`` if its bytes do not inflate to
        at most a window or are not its digest's."""
        inflate = zlib.decompressobj(-15, zdict=self._preset)
        try:
            source = inflate.decompress(stored, WINDOW)
        except zlib.error:
            return None
        if inflate.unconsumed_tail or not inflate.eof:
            return None
        made = self._made(source, stored)
        return made if made.digest == digest else None

    def _made(self, source: bytes, stored: bytes | None = None) -> Dictionary:
        digest = self._digest_of(KIND, source)
        if stored is None:
            stored = deflate_raw(source, LEVEL, self._preset)
        return Dictionary(digest, self._preset + source, ValueRow(digest, KIND, stored),
                          MARK + digest.to_bytes(8, "little", signed=True))

    def _keep(self, thread_id: str, made: Dictionary) -> None:
        self._reading[(thread_id, made.digest)] = made
        self._reading.move_to_end((thread_id, made.digest))
        while len(self._reading) > THREADS:
            self._reading.popitem(last=False)
