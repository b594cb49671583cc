"""``/api/erasures``: erasure by subject or thread within the token's tenant
(``cairn.api.erasure``), for admins only. The tenant is always the token's:
an admin of one tenant cannot name another's subject. A whole tenant is
erased from the CLI only (``cairn erase --tenant``), by the installation's
operator."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from starlette.responses import JSONResponse

from cairn.api.tokens import Role
from cairn.errors import InvalidArgument
from cairn.server.errors import ApiError
from cairn.server.routing import Call, Endpoint


class EraseBody(msgspec.Struct, forbid_unknown_fields=True):
    """One of ``subject`` or ``thread``; ``dry_run``: only count."""

    subject: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    thread: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    dry_run: bool = False


def erase(call: Call[Any]) -> Any:
    body: EraseBody = call.body
    if (body.subject is None) == (body.thread is None):
        raise ApiError(422, "invalid", "name exactly one of subject or thread")
    try:
        done = call.operator.erase(tenant=call.principal.tenant, subject=body.subject, thread=body.thread,
                                   dry_run=body.dry_run)
    except InvalidArgument as exc:
        raise ApiError(422, "invalid", str(exc)) from None
    return JSONResponse(done.as_dict(), status_code=200 if body.dry_run else 201)


def list_erasures(call: Call[Any]) -> Any:
    return {"erasures": [r.as_dict() for r in call.operator.erasures(call.principal.tenant)]}


ROUTES = [
    Endpoint("POST", "/api/erasures", Role.ADMIN, "Erase a subject or a thread of the tenant for good "
             "(keys destroyed, rows deleted, space reclaimed; an erasure record kept)", erase,
             body=EraseBody, status=201, tag="erasures"),
    Endpoint("GET", "/api/erasures", Role.ADMIN, "The tenant's erasure records (no personal data)",
             list_erasures, tag="erasures"),
]
