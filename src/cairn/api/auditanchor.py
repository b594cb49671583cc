"""Signed checkpoints of a tenant's run heads and the file anchor they are
exported to (issue 26; ``api.audit`` verifies against them).

A checkpoint records, for one tenant, each run's head (its last ``seq`` and
the link there), the Merkle root over them (``heads_root``), and
an Ed25519 signature over the whole record with a key from a local key file
(PKCS #8 PEM, written 0600 by ``generate_key``). The record is kept in the
database (``audit_checkpoints``) and appended to an anchor file, one JSON
line per checkpoint, fsynced. The anchor is the point: the database can be
rolled back or rewritten by whoever can write it, a line in a file kept
elsewhere (a WORM bucket, another machine, a transparency log fed from the
file) cannot be changed with it.

``cryptography`` is imported only here, when a key is used (the
``encryption`` extra).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.errors import InvalidArgument

#: The version of the record format.
RECORD_VERSION = 1


def leaf_hash(run_id: str, seq: int, link: bytes) -> bytes:
    """A head's leaf, domain-separated from inner nodes (RFC 6962's 0x00 / 0x01 prefixes)."""
    return hashlib.sha256(b"\x00" + json.dumps([run_id, seq, link.hex()]).encode()).digest()


def merkle_root(leaves: list[bytes]) -> bytes:
    """The root over ``leaves`` (hashed, in run id order), split at the
    largest power of two below the count as RFC 6962 does."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    split = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + merkle_root(leaves[:split]) + merkle_root(leaves[split:])).digest()


def heads_root(heads: dict[str, tuple[int, bytes]]) -> bytes:
    """The Merkle root of run heads ``run_id -> (seq, link)``."""
    return merkle_root([leaf_hash(run_id, seq, link) for run_id, (seq, link) in sorted(heads.items())])


class AnchorError(InvalidArgument):
    """A key file or anchor file that cannot be used (missing, unreadable,
    not a key, a line that is not a checkpoint): a user error, one line."""


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the extra is installed in development
        raise AnchorError("signing audit checkpoints needs the 'cryptography' package: "
                          "pip install 'cairn[encryption]'") from None
    return ed25519


def generate_key(path: Path) -> str:
    """Write a new Ed25519 private key to ``path`` (created, mode 0600; an
    existing file is refused) and its public key beside it (``.pub``);
    return the public key (hex)."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise AnchorError(f"{path} already exists: choose another path (a key is never overwritten)") \
            from None
    except OSError as exc:
        raise AnchorError(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public = public_hex(key.public_key())
    Path(f"{path}.pub").write_text(public + "\n", "utf-8")
    return public


def public_hex(public: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw: bytes = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def load_private(path: Path) -> Any:
    """The Ed25519 private key in ``path``."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise AnchorError(f"cannot read the key file {path}: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise AnchorError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise AnchorError(f"{path} holds a key that is not Ed25519")
    return key


def load_public(path: Path) -> str:
    """The public key (hex) a verifier pins: ``path`` is a private key file,
    or the ``.pub`` file ``generate_key`` wrote beside it."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise AnchorError(f"cannot read the key file {path}: {exc.strerror}") from None
    if text.lstrip().startswith(b"-----BEGIN"):
        return public_hex(load_private(path).public_key())
    candidate = text.decode("ascii", "replace").strip()
    if len(candidate) != 64 or any(c not in "0123456789abcdef" for c in candidate):
        raise AnchorError(f"{path} is neither a PEM private key nor a public key in hex")
    return candidate


def _signed_bytes(record: dict[str, Any]) -> bytes:
    body = {k: v for k, v in record.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def make_record(tenant: str, at: float, heads: dict[str, tuple[int, bytes]], key: Any) -> dict[str, Any]:
    """A signed checkpoint of ``tenant``'s run ``heads`` (run -> (seq, link))."""
    record: dict[str, Any] = {
        "version": RECORD_VERSION, "tenant": tenant, "at": at,
        "runs": len(heads), "entries": sum(seq for seq, _ in heads.values()),
        "root": heads_root(heads).hex(),
        "heads": {run_id: [seq, link.hex()] for run_id, (seq, link) in sorted(heads.items())},
        "key": public_hex(key.public_key()),
    }
    record["signature"] = key.sign(_signed_bytes(record)).hex()
    return record


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint read back from an anchor, its signature and root checked."""

    tenant: str
    at: float
    heads: dict[str, tuple[int, bytes]]
    key: str
    line: int


def check_record(record: Any, line: int, source: str) -> Checkpoint:
    """The checkpoint ``record`` holds, or ``AnchorError`` naming what is
    wrong with it (a bad signature, a root that is not its heads')."""
    where = f"{source} line {line}"
    try:
        heads = {str(r): (int(v[0]), bytes.fromhex(v[1])) for r, v in record["heads"].items()}
        tenant, at, key, root = str(record["tenant"]), float(record["at"]), str(record["key"]), record["root"]
        signature = bytes.fromhex(record["signature"])
        public = _crypto().Ed25519PublicKey.from_public_bytes(bytes.fromhex(key))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        raise AnchorError(f"{where} is not an audit checkpoint") from None
    from cryptography.exceptions import InvalidSignature

    try:
        public.verify(signature, _signed_bytes(record))
    except InvalidSignature:
        raise AnchorError(f"{where}: the signature does not match the checkpoint (the anchor was "
                          f"edited)") from None
    if heads_root(heads).hex() != root:
        raise AnchorError(f"{where}: the root is not the Merkle root of its heads")
    return Checkpoint(tenant, at, heads, key, line)


def append(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to the anchor file ``path`` as one line, durably."""
    data = (json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise AnchorError(f"cannot open the anchor file {path}: {exc.strerror}") from None
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> Iterator[Checkpoint]:
    """Every checkpoint of the anchor file ``path``, in order, each checked."""
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise AnchorError(f"cannot read the anchor file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise AnchorError(f"the anchor file {path} is not text") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise AnchorError(f"{path} line {number} is not JSON") from None
        yield check_record(record, number, str(path))


def latest(path: Path, pinned: str | None) -> dict[str, Checkpoint]:
    """Each tenant's last checkpoint in ``path``; ``pinned``: the public key
    (hex) every checkpoint must be signed with."""
    found: dict[str, Checkpoint] = {}
    for checkpoint in read(path):
        if pinned is not None and checkpoint.key != pinned:
            raise AnchorError(f"{path} line {checkpoint.line} is signed with another key "
                              f"({checkpoint.key[:16]}...)")
        found[checkpoint.tenant] = checkpoint
    return found
