"""Bearer tokens of the HTTP API (``cairn serve``), minted, checked and
revoked here so that the CLI (``cairn tokens``) and the server share one rule.

A token reads ``cairn_<id>_<secret>``: the id is public (it names the token
in listings and in the actor recorded in history), the secret is 256 random
bits. Only the SHA-256 of the secret is stored. A plain hash is enough for a
secret of that entropy (a slow password hash protects guessable secrets; no
one guesses 2**256), and a token is found by its id, then its digest is
compared with ``hmac.compare_digest``, so neither the look-up nor the compare
tells a caller how much of a guessed secret was right.

Each token is bound to one tenant and one role; the roles are ordered
(``viewer`` < ``operator`` < ``admin`` < ``installation``) and each endpoint
names the least one it needs. ``admin`` is the tenant's; ``installation`` is
the operator of the whole installation (queue-wide limits shared by every
tenant), minted with ``cairn tokens mint`` only: a token never mints one
above its own role, so no tenant admin can make itself one.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from cairn.api.actors import acting
from cairn.errors import CairnError, InvalidArgument
from cairn.store.contract import Store
from cairn.store.records import TokenRecord, check_names

_PREFIX = "cairn_"
_SHAPE = re.compile(r"^cairn_([0-9a-f]{16})_([A-Za-z0-9_-]{20,128})$")


class Role(enum.StrEnum):
    """What a token may do. ``viewer``: read; ``operator``: act on runs
    (cancel, kill, resume, retry, budgets, operations; later signals and
    approvals); ``admin``: also the tenant's tokens; ``installation``: also
    what every tenant shares (queue-wide limits, every queue's load)."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    INSTALLATION = "installation"

    def allows(self, needed: Role) -> bool:
        return _RANK[self] >= _RANK[needed]


_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2, Role.INSTALLATION: 3}


class TokenRefused(CairnError):
    """A bearer token that is malformed, unknown or revoked (one error for
    all three: a caller learns nothing about which)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: a checked token's identity."""

    token_id: str
    tenant: str
    role: Role
    name: str

    @property
    def actor(self) -> str:
        """The identity recorded in the history entry of every action it takes."""
        return f"http:{self.name}#{self.token_id}"


@dataclass(frozen=True, slots=True)
class Minted:
    """A new token: ``secret`` is shown once and never stored."""

    record: TokenRecord
    secret: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class Tokens:
    """Mints, checks, lists and revokes the API tokens of one store."""

    def __init__(self, store: Store, actor: str) -> None:
        self._store = store
        self.actor = actor

    def mint(self, tenant: str, role: Role | str, name: str) -> Minted:
        check_names(tenant=tenant)
        control = any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in name)
        if not name or len(name) > 200 or "#" in name or control:
            raise InvalidArgument("a token needs a name of 1 to 200 characters without '#' or control "
                                  "characters")
        try:
            chosen = Role(role)
        except ValueError:
            raise InvalidArgument(f"unknown role {role!r}: choose viewer, operator, admin or "
                                  "installation") from None
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        record = TokenRecord(token_id=token_id, tenant=tenant, role=chosen.value, name=name,
                             digest=digest(secret), created_at=time.time(), created_by=self.actor)
        with acting(self._store, self.actor, tenant, "token", token_id, "token.mint",
                    {"name": name, "role": chosen.value}):
            self._store.create_token(record)
        return Minted(record, f"{_PREFIX}{token_id}_{secret}")

    def check(self, token: str) -> Principal:
        """The identity of a presented token; ``TokenRefused`` if it is not a
        live token of this store."""
        shape = _SHAPE.match(token)
        if shape is None:
            raise TokenRefused("invalid or revoked token")
        token_id, secret = shape.groups()
        record = self._store.get_token(token_id)
        # compare even when there is no record, so an unknown id costs what a known one does
        expected = record.digest if record is not None else digest("")
        matches = hmac.compare_digest(expected, digest(secret))
        if not matches or record is None or record.revoked_at is not None:
            raise TokenRefused("invalid or revoked token")
        try:
            role = Role(record.role)
        except ValueError:
            raise TokenRefused("invalid or revoked token") from None
        return Principal(record.token_id, record.tenant, role, record.name)

    def live(self, token_id: str) -> bool:
        """Whether the token is known and not revoked (an open stream looks
        again: a revoked token's streams end)."""
        record = self._store.get_token(token_id)
        return record is not None and record.revoked_at is None

    def list(self, tenant: str | None = None) -> list[TokenRecord]:
        return self._store.list_tokens(tenant)

    def revoke(self, token_id: str) -> bool:
        """Refuse the token from now on; false if it was unknown or revoked already."""
        record = self._store.get_token(token_id)
        tenant = record.tenant if record is not None else ""
        with acting(self._store, self.actor, tenant, "token", token_id, "token.revoke"):
            return self._store.revoke_token(token_id)
