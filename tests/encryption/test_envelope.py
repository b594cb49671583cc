"""Envelopes and the local keyring (cairn.security.envelope, .keyring): a
value sealed at one place opens there only; every other place, a damaged
byte or plaintext is refused with an error naming the place read."""

from __future__ import annotations

import base64
import os
import threading
import zlib
from pathlib import Path

import pytest

from cairn.errors import ConfigError
from cairn.security import envelope
from cairn.security.envelope import (
    FLAG_ZLIB,
    HEADER_SIZE,
    NONCE_BATCH,
    NONCE_SIZE,
    Place,
    SealError,
    aesgcm,
    fresh_nonce,
    header,
    header_of,
    nonce,
    open_sealed,
    place_of,
    seal,
    synthetic_nonce,
)
from cairn.security.keyring import LocalKeyring, keyring_from_spec, new_kek_line

PLACE = Place("acme", "run-1", "history", "seq 3", "payload")


def opened(cipher: object, place: Place, data: bytes) -> bytes:
    header_of(data, place)
    return open_sealed(cipher, place, data)  # type: ignore[arg-type]


def test_a_value_opens_at_its_place_small_and_compressed() -> None:
    cipher = aesgcm(os.urandom(32))
    for value in (b"", b"x", b'{"a": 1}', b"y" * 5000, os.urandom(4096)):
        sealed = seal(cipher, 7, PLACE, value)
        assert len(value) < 8 or value not in sealed  # one byte may well occur in random ciphertext
        assert header_of(sealed, PLACE).key_version == 7
        assert opened(cipher, PLACE, sealed) == value
    assert len(seal(cipher, 1, PLACE, b"y" * 5000)) < 200  # compressed before sealing


def _sealed_plaintext(cipher: object, place: Place, sealed: bytes) -> bytes:
    """What ``sealed`` encrypted, as stored (compressed or not): AES-GCM opened without ``open_sealed``."""
    nonce_at = sealed[HEADER_SIZE:HEADER_SIZE + NONCE_SIZE]
    associated = sealed[:HEADER_SIZE] + envelope.encode_place(place)
    return cipher.decrypt(nonce_at, sealed[HEADER_SIZE + NONCE_SIZE:], associated)  # type: ignore[attr-defined, no-any-return]


def test_a_value_is_compressed_in_a_window_fitted_to_it_and_content_addressed_ones_as_before() -> None:
    """A value under a random nonce is compressed with a window just large
    enough for it (``envelope.compress``: no 256 KB of zlib state per value,
    issue 25, 2026-12-07); under a synthetic nonce (artifacts: their address
    is a hash of the sealed bytes) with ``zlib.compress`` as before, so equal
    content still seals to the bytes it sealed to; an envelope compressed
    either way opens."""
    cipher = aesgcm(os.urandom(32))
    value = b'"' + b"y" * 1000 + b'"'
    sealed = seal(cipher, 1, PLACE, value)
    assert header_of(sealed, PLACE).flags & FLAG_ZLIB
    stored = _sealed_plaintext(cipher, PLACE, sealed)
    assert (stored[0] >> 4) + 8 == (len(value) - 1).bit_length() < 15  # the window fitted, not 32 KB
    assert zlib.decompress(stored) == opened(cipher, PLACE, sealed) == value
    fixed = synthetic_nonce(os.urandom(32), PLACE, value)
    addressed = seal(cipher, 1, PLACE, value, fixed)
    assert _sealed_plaintext(cipher, PLACE, addressed) == zlib.compress(value, 1)  # the bytes it always had
    assert seal(cipher, 1, PLACE, value, fixed) == addressed
    assert opened(cipher, PLACE, addressed) == value
    # an envelope written before 2026-12-07 (zlib.compress's default window) opens
    head = header(FLAG_ZLIB, 1, PLACE.tenant)
    old_nonce = os.urandom(NONCE_SIZE)
    associated = head + envelope.encode_place(PLACE)
    old = head + old_nonce + cipher.encrypt(old_nonce, zlib.compress(value, 1), associated)
    assert opened(cipher, PLACE, old) == value


def test_a_refill_hands_out_each_nonce_of_one_draw_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fresh_nonce`` cuts one ``os.urandom`` draw into ``NONCE_BATCH``
    nonces (one C call, issue 25, 2026-12-07): the one it returns and those
    it pools are that draw's consecutive ``NONCE_SIZE``-byte pieces, each
    handed out once."""
    drawn = os.urandom(NONCE_SIZE * NONCE_BATCH)
    sizes: list[int] = []
    monkeypatch.setattr(envelope, "_urandom", lambda size: sizes.append(size) or drawn)
    monkeypatch.setattr(envelope, "_nonces", [])
    first = fresh_nonce()
    rest = list(envelope._nonces)
    assert sizes == [NONCE_SIZE * NONCE_BATCH]
    pieces = [drawn[at:at + NONCE_SIZE] for at in range(0, len(drawn), NONCE_SIZE)]
    assert sorted([first, *rest]) == sorted(pieces)
    assert len(set(pieces)) == NONCE_BATCH


@pytest.mark.parametrize("field", ["tenant", "run", "table", "position", "kind"])
def test_a_value_read_at_any_other_place_is_refused_naming_it(field: str) -> None:
    cipher = aesgcm(os.urandom(32))
    sealed = seal(cipher, 1, PLACE, b"secret")
    elsewhere = PLACE._replace(**{field: getattr(PLACE, field) + "x"})
    with pytest.raises(SealError) as caught:
        opened(cipher, elsewhere, sealed)
    assert str(elsewhere) in str(caught.value)


def test_every_damaged_byte_and_plaintext_are_refused() -> None:
    cipher = aesgcm(os.urandom(32))
    sealed = seal(cipher, 1, PLACE, b"secret value")
    for i in range(len(sealed)):
        damaged = bytearray(sealed)
        damaged[i] ^= 0x01
        with pytest.raises(SealError):
            opened(cipher, PLACE, bytes(damaged))
    for plain in (b'"secret value"', b"", b"\xce" + b"\x00" * 10):
        with pytest.raises(SealError, match="not encrypted"):
            opened(cipher, PLACE, plain)


def test_a_value_sealed_with_another_key_is_refused() -> None:
    sealed = seal(aesgcm(os.urandom(32)), 1, PLACE, b"secret")
    with pytest.raises(SealError, match="does not decrypt"):
        opened(aesgcm(os.urandom(32)), PLACE, sealed)


def test_no_nonce_repeats_over_a_million_encryptions_with_one_key() -> None:
    cipher = aesgcm(os.urandom(32))
    seen = set()
    for _ in range(1_000_000):
        sealed = seal(cipher, 1, PLACE, b"v")
        seen.add(sealed[HEADER_SIZE:HEADER_SIZE + NONCE_SIZE])
    assert len(seen) == 1_000_000


def test_threads_drawing_nonces_from_the_pool_never_get_the_same_one() -> None:
    """Eight threads, each 20,000 nonces (the pool refilled about 2,500 times,
    often by two threads at once): every nonce handed out once."""
    drawn: list[list[bytes]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(mine: list[bytes]) -> None:
        start.wait()
        for _ in range(20_000):
            mine.append(nonce())

    threads = [threading.Thread(target=draw, args=(mine,)) for mine in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [n for mine in drawn for n in mine]
    assert all(len(n) == NONCE_SIZE for n in every)
    assert len(set(every)) == len(every) == 160_000


@pytest.mark.slow  # a forked process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_never_seals_with_its_parents_pooled_nonces() -> None:
    """A child forked with nonces left in the pool draws new ones: parent and
    child seal under the same keys, so one shared nonce would be a reuse."""
    nonce()  # the pool holds what this draw left
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's; its nonces reach the parent through the pipe)
        try:
            os.write(write, b"".join(nonce() for _ in range(200)))
        finally:
            os._exit(0)
    os.close(write)
    received = b""
    while chunk := os.read(read, 65536):
        received += chunk
    os.close(read)
    os.waitpid(child, 0)
    theirs = {received[at:at + NONCE_SIZE] for at in range(0, len(received), NONCE_SIZE)}
    ours = {nonce() for _ in range(200)}
    assert len(theirs) == 200
    assert not ours & theirs


def test_the_local_keyring_from_a_file_and_an_environment_variable(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# KEKs, the last one current\n{new_kek_line('old')}\n{new_kek_line('new')}\n")
    ring = keyring_from_spec(f"file:{path}")
    assert ring.current() == "new"
    assert ring.ids() == ["old", "new"]
    wrapped = ring.wrap("old", b"k" * 32, b"acme\x001")
    assert ring.unwrap("old", wrapped, b"acme\x001") == b"k" * 32
    with pytest.raises(SealError, match="does not unwrap"):
        ring.unwrap("old", wrapped, b"other\x001")  # a key row moved to another tenant
    with pytest.raises(SealError, match="does not unwrap"):
        ring.unwrap("new", wrapped, b"acme\x001")
    with pytest.raises(SealError, match="does not hold KEK 'gone'"):
        ring.unwrap("gone", wrapped, b"acme\x001")
    monkeypatch.setenv("MY_KEK", f"k1:{base64.b64encode(os.urandom(32)).decode()}")
    assert keyring_from_spec("env:MY_KEK").current() == "k1"


@pytest.mark.parametrize(("text", "problem"), [
    ("", "holds no key-encryption key"),
    ("k1", "is not '<kek id> <base64 key>'"),
    ("k1 !!!notbase64", "is not base64"),
    (f"k1 {base64.b64encode(b'short').decode()}", "is 5 bytes"),
    (f"bad/id {base64.b64encode(bytes(32)).decode()}", "bad KEK id"),
])
def test_a_malformed_keyring_is_one_line_naming_its_source_never_a_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        LocalKeyring.parse(text, "$MY_KEK")
    message = str(caught.value)
    assert problem in message
    assert "\n" not in message
    assert "notbase64" not in message


def test_an_unknown_keyring_spec_and_a_missing_file_or_variable_are_config_errors(tmp_path: Path) -> None:
    for spec in ("kms:x", "file:", f"file:{tmp_path}/none", "env:CAIRN_TEST_UNSET_VARIABLE"):
        with pytest.raises(ConfigError):
            keyring_from_spec(spec)


def test_encryption_without_its_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    import sys

    import cairn
    from cairn.errors import MissingExtra

    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    ring = LocalKeyring({"k1": bytes(32)}, "k1")
    with pytest.raises(MissingExtra) as caught:
        cairn.App(db=f"sqlite:///{tmp_path}/c.db", keyring=ring)
    assert "'encryption'" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "c.db").exists()  # refused before anything was opened
    cairn.App(db=f"sqlite:///{tmp_path}/plain.db").close()  # without a keyring: not needed


def test_place_of_builds_the_same_place_as_its_constructor() -> None:
    parts = ("acme", "run-1", "history", "seq 3", "payload")
    built = place_of(parts)
    assert type(built) is Place
    assert built == PLACE
    assert str(built) == str(PLACE)
    assert built.associated() == PLACE.associated()
    assert built.tenant == "acme"


def test_raw_deflate_gives_a_freshly_primed_compressors_bytes_at_any_level_and_size() -> None:
    """``deflate_raw`` copies a primed compressor (issue 24, 2026-12-07):
    each call's bytes are those of a compressor set up and primed for it
    alone, whatever was compressed before or beside it, and inflate back."""
    zdict = b"the dictionary: messages, channel_versions, branch:to:, __start__ " * 4

    def fresh(data: bytes, level: int) -> bytes:
        wbits = envelope.fitted_window(len(zdict) + len(data))
        c = zlib.compressobj(level, zlib.DEFLATED, -wbits, wbits - 6, zlib.Z_DEFAULT_STRATEGY, zdict=zdict)
        return c.compress(data) + c.flush()

    datas = [b"", b"x", zdict[:100], os.urandom(300), zdict * 3 + os.urandom(2000), b"ab" * 9000]
    for level in (1, 6, 9):
        for data in datas * 2:  # the second time from the compressor kept by the first
            out = envelope.deflate_raw(data, level, zdict)
            assert out == fresh(data, level)
            assert zlib.decompressobj(-15, zdict=zdict).decompress(out) == data
    wrong: list[bytes] = []

    def many() -> None:
        for data in datas * 20:
            if envelope.deflate_raw(data, 1, zdict) != fresh(data, 1):
                wrong.append(data)

    threads = [threading.Thread(target=many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
