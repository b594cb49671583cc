"""``/api/tokens`` and ``/api/whoami``: who a token is, and an admin's view
of the tenant's tokens (list, mint, revoke). Tokens of other tenants are
invisible: revoking one answers 404 like an unknown id. A token mints no
role above its own (403), so the ``installation`` role comes from
``cairn tokens mint`` only."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from starlette.responses import JSONResponse

from cairn.api.tokens import Role, Tokens
from cairn.server.errors import ApiError, not_found
from cairn.server.routing import Call, Endpoint
from cairn.store.records import TokenRecord

#: A token name as ``Tokens.mint`` takes it, in the ECMAScript form of the document (``$(?!\n)``: the end).
TOKEN_NAME = r"^[^#\x00-\x1f\x7f-\x9f]+$(?!\n)"


class MintBody(msgspec.Struct, forbid_unknown_fields=True):
    #: what ``Tokens.mint`` takes: no '#' (it separates name and id in an actor) and no control character
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=TOKEN_NAME)]
    role: Role = Role.VIEWER


def token_json(record: TokenRecord) -> dict[str, Any]:
    return {"token_id": record.token_id, "tenant": record.tenant, "role": record.role, "name": record.name,
            "created_at": record.created_at, "created_by": record.created_by, "revoked_at": record.revoked_at}


def whoami(call: Call[Any]) -> Any:
    p = call.principal
    return {"token_id": p.token_id, "tenant": p.tenant, "role": p.role.value, "name": p.name,
            "actor": p.actor}


def list_tokens(call: Call[Any]) -> Any:
    return {"tokens": [token_json(t) for t in call.app.tokens.list(call.principal.tenant)]}


def mint_token(call: Call[Any]) -> Any:
    body: MintBody = call.body
    if not call.principal.role.allows(body.role):  # a tenant admin never makes itself the installation
        raise ApiError(403, "forbidden", f"a {call.principal.role.value} token cannot mint a "
                                         f"{body.role.value} token (cairn tokens mint can)")
    minted = _as_caller(call).mint(call.principal.tenant, body.role, body.name)
    return JSONResponse({**token_json(minted.record), "token": minted.secret}, status_code=201)


def revoke_token(call: Call[Any]) -> Any:
    token_id = call.path["token_id"]
    mine = {t.token_id for t in call.app.tokens.list(call.principal.tenant)}
    if token_id not in mine:
        raise not_found(f"no token with id {token_id!r}")
    return {"token_id": token_id, "revoked": _as_caller(call).revoke(token_id)}


def _as_caller(call: Call[Any]) -> Tokens:
    """The tokens acting as the presented token (its identity is the
    operator log's actor), of this request only: never the app's shared
    ``Tokens``, whose actor a concurrent request would see changed."""
    return Tokens(call.app.store, call.principal.actor)


ROUTES = [
    Endpoint("GET", "/api/whoami", Role.VIEWER, "The identity of the presented token", whoami, tag="tokens"),
    Endpoint("GET", "/api/tokens", Role.ADMIN, "The tenant's tokens (secrets are never shown again)",
             list_tokens, tag="tokens"),
    Endpoint("POST", "/api/tokens", Role.ADMIN, "Mint a token of the tenant (its secret is shown once)",
             mint_token, body=MintBody, status=201, tag="tokens"),
    Endpoint("DELETE", "/api/tokens/{token_id}", Role.ADMIN, "Revoke a token of the tenant", revoke_token,
             tag="tokens"),
]
