"""Maps every failure to a status a client can act on, so nothing a client sends produces a 500.

Store unreachable or overloaded → 503 with ``Retry-After`` (agents spool and retry); a unique or foreign key
refusing a write → 409; a value the store cannot hold → 422; validation errors → 422 naming each field (without
echoing the input back: a rejected batch can be megabytes). A 500 remains only for bugs, logged with traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from trimtab.api.deps import refused_token
from trimtab.api.writers import StoreBusy

log = logging.getLogger(__name__)
_FASTAPI_UNPARSABLE_BODY = "There was an error parsing the body"
RETRY_AFTER_S = 5


def invalid(loc: tuple, message: str) -> RequestValidationError:
    """A 422 in the same shape as pydantic's, for checks that need more than one field or the store."""
    return RequestValidationError([{"loc": loc, "msg": message, "type": "value_error"}])


def _json(status: int, detail, headers=None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    refused = await refused_token(request)  # a tokenless write is 401 whatever its body
    if refused is not None:
        return await http_exception_handler(request, refused)
    errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors()]
    return _json(422, jsonable_encoder(errors))


async def _http(request: Request, exc: StarletteHTTPException):
    # FastAPI answers 400 for a body json.loads raised on with something other than JSONDecodeError (invalid UTF-8,
    # nesting past the recursion limit, an integer over the digit limit): for the client that is malformed
    # JSON like any other, so it gets the same 422.
    if exc.status_code == 400 and exc.detail == _FASTAPI_UNPARSABLE_BODY:
        refused = await refused_token(request)
        if refused is not None:
            return await http_exception_handler(request, refused)
        return _json(422, [{"loc": ["body"], "msg": "the body could not be parsed as JSON (invalid UTF-8, too deep, or a number too long)", "type": "json_invalid"}])
    if exc.status_code == 405:
        # Starlette's Allow names the methods of the one route it tried; a path is often several routes (GET and
        # POST /v1/jobs), and Allow must list every method the path has.
        return _json(405, "method not allowed", {"Allow": ", ".join(_methods_of_path(request))})
    return await http_exception_handler(request, exc)


def _methods_of_path(request: Request) -> list[str]:
    """Every method some route serves at this path (asked of the routes themselves: FastAPI nests routers)."""
    return [method for method in _HTTP_METHODS
            if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
                   for route in request.app.router.routes)]


_HTTP_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


async def _store_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("store unavailable: %s", " ".join(str(getattr(exc, "orig", None) or exc).split())[:300])
    return _json(503, "store unavailable; retry later", {"Retry-After": str(RETRY_AFTER_S)})


async def _conflict(_request: Request, exc: Exception) -> JSONResponse:
    return _json(409, "conflicts with what the store holds (a concurrent change?); retry or re-read")


async def _unstorable(_request: Request, exc: Exception) -> JSONResponse:
    return _json(422, "a value cannot be stored (out of range or malformed for the store)")


async def _dbapi(request: Request, exc: DBAPIError) -> JSONResponse:
    if exc.connection_invalidated:
        return await _store_unavailable(request, exc)
    return await _last_resort(request, exc)


async def _last_resort(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return _json(500, "internal error (logged on the server)")


def install_error_handlers(app: FastAPI, dbapi) -> None:
    """``dbapi``: the engine's DB-API module, whose own errors escape SQLAlchemy at pool checkout."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    for unavailable in (OperationalError, PoolTimeout, StoreBusy, dbapi.OperationalError, dbapi.InterfaceError):
        app.add_exception_handler(unavailable, _store_unavailable)
    for conflict in (IntegrityError, dbapi.IntegrityError):
        app.add_exception_handler(conflict, _conflict)
    for unstorable in (DataError, dbapi.DataError):
        app.add_exception_handler(unstorable, _unstorable)
    app.add_exception_handler(DBAPIError, _dbapi)
    app.add_exception_handler(Exception, _last_resort)
