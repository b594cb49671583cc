"""Key-encryption keys (KEKs): what wraps each tenant's data keys.

Data keys (AES-256, one per tenant and key version) are stored in the
database wrapped by a KEK; the KEK never is. A ``Keyring`` holds KEKs by id
and names the current one (new data keys are wrapped with it). Rotating the
KEK rewraps the data keys only: no value is re-encrypted.

``LocalKeyring`` is the keyring shipped: its KEKs come from a key file or an
environment variable, one KEK per line (or per comma-separated item)::

    <kek id> <32 bytes in base64>

The last one listed is current; the others stay to unwrap data keys wrapped
before a rotation. ``keyring_from_spec`` opens one from a spec string:
``file:/path/to/keys`` or ``env:VARIABLE`` (``$CAIRN_KEYRING`` holds such a
spec for processes that open a store from a URL: workers, the CLI).
Vault's transit engine (``cairn.security.vault``) and AWS KMS
(``cairn.security.awskms``) implement the same protocol.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from cairn.errors import ConfigError
from cairn.security.envelope import KEY_SIZE, NONCE_SIZE, SealError, aesgcm
from cairn.security.shredding import SUBJECT_KEYS_ENV, FileShredder, Shredder

#: the environment variable naming the keyring of processes that open a store from a URL
KEYRING_ENV = "CAIRN_KEYRING"
_KEK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@runtime_checkable
class Keyring(Protocol):
    """Wraps and unwraps data keys with key-encryption keys held elsewhere."""

    def current(self) -> str:
        """The id of the KEK that wraps new data keys."""
        ...

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> bytes:
        """``key`` wrapped by KEK ``kek_id``, bound to ``context`` (tenant and version)."""
        ...

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        """The key ``wrap`` wrapped; ``SealError`` if KEK ``kek_id`` is not
        held or the wrapped key was not wrapped by it for ``context``."""
        ...


class LocalKeyring:
    """KEKs held in this process, read from a key file or an environment
    variable (see the module doc). Wrapping is AES-256-GCM with the KEK,
    a random nonce and ``context`` as associated data."""

    def __init__(self, keks: Mapping[str, bytes], current: str, shredder: Shredder | None = None) -> None:
        if current not in keks:
            raise ConfigError(f"the current KEK {current!r} is not in the keyring")
        for kek_id, key in keks.items():
            if not _KEK_ID.match(kek_id):
                raise ConfigError(f"bad KEK id {kek_id!r}: use 1-64 letters, digits, '_.-'")
            if len(key) != KEY_SIZE:
                raise ConfigError(f"KEK {kek_id!r} is {len(key)} bytes: a KEK is {KEY_SIZE} bytes (base64)")
        self._keks = dict(keks)
        self._current = current
        #: where subject secrets live (``cairn.security.shredding``): erasable keys need one
        self.shredder = shredder

    @classmethod
    def parse(cls, text: str, source: str, shredder: Shredder | None = None) -> LocalKeyring:
        """A keyring from ``text`` (lines or comma-separated ``id base64``);
        ``ConfigError`` naming ``source`` (never a key) if malformed."""
        keks: dict[str, bytes] = {}
        last = None
        items = [item.strip() for line in text.splitlines() if not line.lstrip().startswith("#")
                 for item in line.split(",")]
        for number, item in enumerate(items, 1):
            if not item:
                continue
            parts = item.replace(":", " ", 1).split() if " " not in item else item.split()
            if len(parts) != 2:
                raise ConfigError(f"{source}: item {number} is not '<kek id> <base64 key>'")
            try:
                key = base64.b64decode(parts[1], validate=True)
            except (binascii.Error, ValueError):
                raise ConfigError(f"{source}: the key of KEK {parts[0]!r} is not base64") from None
            keks[parts[0]] = key
            last = parts[0]
        if last is None:
            raise ConfigError(f"{source} holds no key-encryption key")
        if shredder is None and os.environ.get(SUBJECT_KEYS_ENV):
            shredder = FileShredder(os.environ[SUBJECT_KEYS_ENV])
        return cls(keks, last, shredder)

    @classmethod
    def from_file(cls, path: str | Path) -> LocalKeyring:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the key file {str(path)!r}: {exc.strerror or exc}") from None
        subjects = os.environ.get(SUBJECT_KEYS_ENV) or f"{path}.subjects"
        return cls.parse(text, f"key file {str(path)!r}", FileShredder(subjects))

    @classmethod
    def from_env(cls, variable: str) -> LocalKeyring:
        text = os.environ.get(variable)
        if not text:
            raise ConfigError(f"${variable} is not set: it should hold '<kek id> <base64 key>'")
        return cls.parse(text, f"${variable}")

    def current(self) -> str:
        return self._current

    def ids(self) -> list[str]:
        return list(self._keks)

    def _kek(self, kek_id: str) -> bytes:
        try:
            return self._keks[kek_id]
        except KeyError:
            raise SealError(f"the keyring does not hold KEK {kek_id!r}") from None

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> bytes:
        nonce = os.urandom(NONCE_SIZE)
        return nonce + aesgcm(self._kek(kek_id)).encrypt(nonce, key, b"cairn-data-key\x00" + context)

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            return aesgcm(self._kek(kek_id)).decrypt(wrapped[:NONCE_SIZE], wrapped[NONCE_SIZE:],
                                                     b"cairn-data-key\x00" + context)
        except InvalidTag:
            raise SealError(f"a data key does not unwrap with KEK {kek_id!r}: wrong key, "
                            "or the key row was edited or moved") from None


def new_kek_line(kek_id: str) -> str:
    """A line for a key file: ``kek_id`` and 32 fresh random bytes (base64)."""
    if not _KEK_ID.match(kek_id):
        raise ConfigError(f"bad KEK id {kek_id!r}: use 1-64 letters, digits, '_.-'")
    return f"{kek_id} {base64.b64encode(os.urandom(KEY_SIZE)).decode()}"


def keyring_from_spec(spec: str) -> Keyring:
    """A keyring from ``file:/path``, ``env:VARIABLE``, ``vault:[MOUNT/]KEY``
    (Vault's transit engine at ``$VAULT_ADDR``, ``cairn.security.vault``) or
    ``aws-kms:KEY`` (an AWS KMS key id, ARN or ``alias/NAME``, credentials
    and region from the environment, ``cairn.security.awskms``)."""
    kind, _, where = spec.partition(":")
    if kind == "file" and where:
        return LocalKeyring.from_file(where)
    if kind == "env" and where:
        return LocalKeyring.from_env(where)
    if kind == "vault" and where:
        from cairn.security.vault import VaultTransitKeyring

        return VaultTransitKeyring.from_env(where)
    if kind == "aws-kms" and where:
        from cairn.security.awskms import AwsKmsKeyring

        return AwsKmsKeyring.from_env(where)
    raise ConfigError(f"unknown keyring {spec[:40]!r}: use file:/path/to/keys, env:VARIABLE, vault:KEY "
                      "or aws-kms:KEY")


def keyring_from_env() -> Keyring | None:
    """The keyring ``$CAIRN_KEYRING`` names, or ``None`` when unset."""
    spec = os.environ.get(KEYRING_ENV)
    return keyring_from_spec(spec) if spec else None
