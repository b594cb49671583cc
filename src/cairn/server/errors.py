"""Every error the API answers is JSON, ``{"error": code, "message": ...}``,
with the status that says whose fault it is. Cairn's own errors map to 4xx
here, once; anything else is a bug and answers 500 with no detail (the
traceback goes to the server's log, never to the client). A store failure
answers 503 with no detail either: its message names the database."""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from cairn.api.tokens import TokenRefused
from cairn.errors import (
    ApprovalClosed,
    ApprovalNotFound,
    CairnError,
    InvalidArgument,
    InvalidEdit,
    InvalidRunState,
    NotAnApprover,
    PayloadError,
    RunNotFound,
    StoreError,
    UnknownWorkflow,
)

log = logging.getLogger("cairn.server")


class ApiError(Exception):
    """An answer other than success: ``status``, a stable ``code`` and a message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": code, "message": message}


def as_api_error(exc: BaseException) -> ApiError:
    """The API's answer to ``exc``."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, (RunNotFound, ApprovalNotFound)):
        return not_found(str(exc))
    if isinstance(exc, InvalidEdit):  # well-formed JSON that does not fit the request's schema
        return ApiError(422, "invalid_edit", str(exc))
    if isinstance(exc, ApprovalClosed):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, NotAnApprover):
        return ApiError(403, "not_an_approver", str(exc))
    if isinstance(exc, TokenRefused):
        return ApiError(401, "unauthorized", str(exc))
    if isinstance(exc, InvalidRunState):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, UnknownWorkflow):
        return ApiError(422, "unknown_workflow", str(exc))
    if isinstance(exc, (InvalidArgument, PayloadError, ValueError)):
        return ApiError(400, "invalid", str(exc))
    if isinstance(exc, StoreError):  # its message may name the database (host, port, name): logged only
        log.warning("store failure: %s", exc)
        return ApiError(503, "unavailable", "the store is unavailable; try again (the server's log says why)")
    if isinstance(exc, CairnError):
        return ApiError(400, "invalid", str(exc))
    if isinstance(exc, ClientDisconnect):  # the client's doing, as often as it likes: no traceback
        log.info("a request body was cut off: the client disconnected")
        return ApiError(400, "invalid", "the request body was cut off (the client disconnected)")
    log.error("unexpected error", exc_info=exc)
    return ApiError(500, "internal", "internal error (see the server's log)")


def response_for(exc: BaseException) -> JSONResponse:
    error = as_api_error(exc)
    headers = {"WWW-Authenticate": 'Bearer realm="cairn"'} if error.status == 401 else None
    return JSONResponse(error_body(error.code, error.message), status_code=error.status, headers=headers)


async def http_exception(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own 404 (no route) and 405 (wrong method), as JSON."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid")
    return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def any_exception(request: Request, exc: Exception) -> JSONResponse:
    return response_for(exc)
