"""A keyring whose key-encryption key lives in HashiCorp Vault's transit engine.

The KEK never leaves Vault: a data key is wrapped by ``POST
/v1/<mount>/encrypt/<key>`` and unwrapped by ``.../decrypt/<key>``, with the
data key's tenant and version as the request's ``associated_data`` (an
AES-GCM transit key binds the ciphertext to it). The KEK id stored with each
data key is ``vault:<mount>/<key>``; Vault's own key versions live inside its
ciphertext (``vault:vN:...``), so rotating the key in Vault needs no rewrap
here for old data keys to open (``vault write -f transit/keys/<key>/rotate``),
and ``cairn keys rotate --kek`` after pointing the keyring at another key
rewraps every data key with it.

Plain ``urllib`` over HTTP(S): no client library, so no extra to install
beyond ``encryption``. ``$VAULT_ADDR`` and ``$VAULT_TOKEN`` configure it, as
for the ``vault`` CLI; ``keyring_from_spec("vault:transit/cairn")`` opens one.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from typing import Any

from cairn.errors import ConfigError
from cairn.security.envelope import SealError
from cairn.security.shredding import SUBJECT_KEYS_ENV, FileShredder


class VaultTransitKeyring:
    """Wraps data keys with a Vault transit key (see the module doc)."""

    def __init__(self, address: str, token: str, key: str, *, mount: str = "transit",
                 timeout: float = 10.0) -> None:
        if not address.startswith(("http://", "https://")):
            raise ConfigError(f"Vault address {address[:60]!r} is not an http(s) URL")
        if not token:
            raise ConfigError("no Vault token: set $VAULT_TOKEN")
        subjects = os.environ.get(SUBJECT_KEYS_ENV)
        #: subject secrets (erasable keys) live in a file named by $CAIRN_SUBJECT_KEYS, if set
        self.shredder = FileShredder(subjects) if subjects else None
        for part, what in ((key, "key"), (mount, "mount")):
            if not part or any(c in part for c in "?#\\ ") or ".." in part:
                raise ConfigError(f"bad Vault transit {what} {part[:60]!r}")
        self.address = address.rstrip("/")
        self._token = token
        self.key = key
        self.mount = mount.strip("/")
        self.timeout = timeout

    @classmethod
    def from_env(cls, where: str) -> VaultTransitKeyring:
        """``where`` is ``<mount>/<key>`` or ``<key>`` (mount ``transit``)."""
        mount, _, key = where.rpartition("/")
        return cls(os.environ.get("VAULT_ADDR", ""), os.environ.get("VAULT_TOKEN", ""), key,
                   mount=mount or "transit")

    def current(self) -> str:
        return f"vault:{self.mount}/{self.key}"

    def _call(self, kek_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        if not kek_id.startswith("vault:"):
            raise SealError(f"KEK {kek_id!r} is not a Vault transit key: this keyring cannot unwrap it")
        path = kek_id.removeprefix("vault:")
        mount, _, key = path.rpartition("/")
        request = urllib.request.Request(
            f"{self.address}/v1/{mount}/{action}/{key}", data=json.dumps(body).encode(), method="POST",
            headers={"X-Vault-Token": self._token, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # http(s): checked above
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = _errors(exc)
            if exc.code in (401, 403):
                problem = f"Vault refused the token for {action} with {kek_id} ({exc.code}{detail})"
                raise ConfigError(problem) from None
            raise SealError(f"Vault could not {action} with {kek_id} ({exc.code}{detail})") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConfigError(f"cannot reach Vault at {self.address}: {reason}") from None
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, dict):
            raise SealError(f"Vault's answer to {action} with {kek_id} has no data")
        return data

    def wrap(self, kek_id: str, key: bytes, context: bytes) -> bytes:
        data = self._call(kek_id, "encrypt", {"plaintext": base64.b64encode(key).decode(),
                                              "associated_data": base64.b64encode(context).decode()})
        ciphertext = data.get("ciphertext")
        if not isinstance(ciphertext, str):
            raise SealError(f"Vault's answer to encrypt with {kek_id} has no ciphertext")
        return ciphertext.encode()

    def unwrap(self, kek_id: str, wrapped: bytes, context: bytes) -> bytes:
        data = self._call(kek_id, "decrypt", {"ciphertext": wrapped.decode(errors="replace"),
                                              "associated_data": base64.b64encode(context).decode()})
        try:
            return base64.b64decode(str(data.get("plaintext")), validate=True)
        except (ValueError, TypeError):
            raise SealError(f"Vault's answer to decrypt with {kek_id} is not base64") from None


def _errors(exc: urllib.error.HTTPError) -> str:
    """Vault's error messages, on one line (never a key: Vault does not echo them)."""
    try:
        errors = json.loads(exc.read()).get("errors") or []
    except (ValueError, AttributeError, OSError):
        return ""
    text = "; ".join(str(e) for e in errors)[:200].replace("\n", " ")
    return f": {text}" if text else ""
