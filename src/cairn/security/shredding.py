"""Subject secrets: the part of a subject's data key that lives outside the database.

Crypto-shredding a subject must survive a restored backup: a copy of the
database taken before the erasure still holds the subject's wrapped data key,
and the keyring that wraps it is still the current one (other subjects' data
in that copy must stay readable). So a subject's data key is derived from two
halves (``cairn.store.sealing``): a random key stored wrapped in the database
(``data_keys``) and a random *subject secret* held here, next to the KEKs and
never in the database. Erasure destroys the secret; without it neither the
live database nor any copy of it can rebuild the key.

``FileShredder`` keeps the secrets in one file (``<key file>.subjects`` for a
``file:`` keyring, ``$CAIRN_SUBJECT_KEYS`` otherwise), one ``<name> <base64>``
line each, rewritten whole (a temporary file, fsync, rename) under an
exclusive lock, so concurrent processes agree on one secret per name and a
crash leaves the old file or the new one. Names are opaque (a digest of the
tenant and key version): the file holds no personal data.

What it does not do: overwrite the blocks the old file occupied. A destroyed
secret may survive in the file system's free space (or an SSD's spare blocks)
until reused; keep the file on storage you can discard, or use a KMS.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import os
import threading
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from cairn.errors import ConfigError
from cairn.security.envelope import KEY_SIZE

#: the environment variable naming the subject-secret file of a keyring not read from a file
SUBJECT_KEYS_ENV = "CAIRN_SUBJECT_KEYS"


@runtime_checkable
class Shredder(Protocol):
    """Holds subject secrets by name and destroys them on request."""

    def secret(self, name: str, *, create: bool) -> bytes | None:
        """The secret ``name`` (made and stored first if ``create`` and
        absent); ``None`` if absent and not created (destroyed, or never made)."""
        ...

    def destroy(self, names: Collection[str]) -> int:
        """Destroy the secrets ``names``; how many existed."""
        ...


class FileShredder:
    """Subject secrets in one file (see the module doc)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._cache: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot open the subject key file lock {str(lock_path)!r}: "
                              f"{exc.strerror or exc}") from None
        with self._lock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _read(self) -> dict[str, bytes]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"cannot read the subject key file {str(self.path)!r}: "
                              f"{exc.strerror or exc}") from None
        found: dict[str, bytes] = {}
        for number, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if not parts:
                continue
            try:
                secret = base64.b64decode(parts[1], validate=True) if len(parts) == 2 else b""
            except (binascii.Error, ValueError):
                secret = b""
            if len(secret) != KEY_SIZE:
                raise ConfigError(f"subject key file {str(self.path)!r}: line {number} is not "
                                  "'<name> <base64 32 bytes>'")
            found[parts[0]] = secret
        return found

    def _write(self, secrets: dict[str, bytes]) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        text = "".join(f"{name} {base64.b64encode(key).decode()}\n" for name, key in secrets.items())
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, text.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise ConfigError(f"cannot write the subject key file {str(self.path)!r}: "
                              f"{exc.strerror or exc}") from None

    def secret(self, name: str, *, create: bool) -> bytes | None:
        known = self._cache.get(name)
        if known is not None:
            return known
        with self._locked():
            secrets = self._read()
            found = secrets.get(name)
            if found is None and create:
                found = secrets[name] = os.urandom(KEY_SIZE)
                self._write(secrets)
        if found is not None:
            self._cache[name] = found
        return found

    def destroy(self, names: Collection[str]) -> int:
        with self._locked():
            secrets = self._read()
            gone = [name for name in names if name in secrets]
            for name in gone:
                del secrets[name]
            if gone:
                self._write(secrets)
        for name in names:
            self._cache.pop(name, None)
        return len(gone)


def shredder_of(keyring: object) -> Shredder:
    """The keyring's subject-secret store; ``ConfigError`` (one line) if it has none."""
    shredder = getattr(keyring, "shredder", None)
    if shredder is None:
        raise ConfigError("runs with a subject need a keyring that holds subject secrets (erasable keys): "
                          "a file: keyring (it keeps them in <key file>.subjects), "
                          f"or set ${SUBJECT_KEYS_ENV}")
    return shredder  # type: ignore[no-any-return]
