"""Dependencies shared by the routes: the context, bearer-token scopes, pagination, and the error responses
each kind of route can give (for the OpenAPI document)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from fastapi import HTTPException, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trimtab.api.auth import allows
from trimtab.api.context import ApiContext
from trimtab.api.schemas_base import ErrorOut
from trimtab.store.tokens import StoredToken

MAX_PAGE = 1000
MAX_OFFSET = 10**9

bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="A token from POST /v1/tokens (or the admin.token file written at first start).")


# Dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency on its thread pool, one
# hand-off to a worker thread and back per request for an attribute read (issue 20: a report's CPU).
async def get_ctx(request: Request) -> ApiContext:
    return request.app.state.ctx


def _checked(request: Request, credentials: Optional[HTTPAuthorizationCredentials], scope: str) -> StoredToken:
    """The token behind ``credentials`` if it may act with ``scope`` (admin may do everything): 401 without a valid
    token, 403 with a token of another scope. Reads the token's row (a revocation takes effect at once)."""
    if credentials is None:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
    token = request.app.state.auth.authenticate(credentials.credentials)
    if token is None:
        raise HTTPException(401, "unknown or revoked token",
                            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    if not allows(token.scope, scope):
        raise HTTPException(403, f"a {token.scope!r} token may not do this: scope {scope!r} needed")
    return token


def require_scope(scope: str):
    """A dependency admitting only tokens with ``scope`` (admin admits everything): 401 without a valid token,
    403 with a token of another scope."""

    def dependency(request: Request,
                   credentials: Optional[HTTPAuthorizationCredentials] = Security(bearer)) -> StoredToken:
        return _checked(request, credentials, scope)

    dependency.__name__ = f"require_{scope}"
    dependency.trimtab_scope = scope  # read by the error handlers: a body that cannot be parsed is refused after
    return dependency                 # the token check, not before it (see :func:`refused_token`)


@dataclass(frozen=True)
class TokenCheck:
    """A bearer token read from the header and checked when the route calls this, on the route's own thread."""
    request: Request
    credentials: Optional[HTTPAuthorizationCredentials]
    scope: str

    def __call__(self) -> StoredToken:
        return _checked(self.request, self.credentials, self.scope)


def scope_checked_by_route(scope: str):
    """:func:`require_scope` for the job loop's hot routes (reports, acks): the token is checked by the route,
    first thing, on the thread the route runs on anyway. A ``def`` dependency does its I/O on a thread of its own:
    a second hand-off to the thread pool and back per request, one more queue a report waits in when the pool and
    the interpreter lock are busy (issue 20; planning-phase p50 0.1–0.5 ms lower, BENCHMARKS.md).
    The route must call the :class:`TokenCheck` before it reads or writes anything."""

    async def dependency(request: Request,
                         credentials: Optional[HTTPAuthorizationCredentials] = Security(bearer)) -> TokenCheck:
        return TokenCheck(request, credentials, scope)

    dependency.__name__ = f"require_{scope}_in_route"
    dependency.trimtab_scope = scope  # as for require_scope: the error handlers check it before a 422
    return dependency


async def refused_token(request: Request) -> Optional[HTTPException]:
    """The 401/403 the route's token check gives this request, or None (no check, or it passes).

    FastAPI parses a JSON body before it runs a route's dependencies (and a route that checks its token itself
    runs after the body is validated), so without this a malformed body from a client without a token would get
    422 instead of the 401 every other tokenless write gets."""
    route = request.scope.get("route")
    pending = list(getattr(getattr(route, "dependant", None), "dependencies", []))
    while pending:
        dep = pending.pop()
        scope = getattr(dep.call, "trimtab_scope", None)
        if scope is not None:
            try:
                _checked(request, await bearer(request), scope)
            except HTTPException as exc:
                return exc
            return None
        pending.extend(dep.dependencies)
    return None


@dataclass(frozen=True)
class Page:
    limit: int
    offset: int

    def fetch(self) -> int:
        """Rows to fetch: one more than the page, to know whether another page follows."""
        return self.limit + 1

    def cut(self, rows: list) -> tuple[list, Optional[int]]:
        """The page's rows and the next page's offset (None on the last page)."""
        more = len(rows) > self.limit
        return rows[:self.limit], (self.offset + self.limit if more else None)


async def page(limit: int = Query(100, ge=1, le=MAX_PAGE, description="Page size (at most 1000)."),
         offset: int = Query(0, ge=0, le=MAX_OFFSET, description="Rows to skip (next_offset of the previous page).")
         ) -> Page:
    return Page(limit, offset)


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description}


STORE_DOWN = {503: _error("The store is unreachable; retry after Retry-After seconds.")}
READ = STORE_DOWN
NOT_FOUND = {404: _error("No such resource.")}
WRITE = {401: _error("Missing, unknown or revoked bearer token."),
         403: _error("The token's scope does not allow this."),
         409: _error("Conflicts with the stored state."),
         413: _error("Request body too large."),
         **STORE_DOWN}
