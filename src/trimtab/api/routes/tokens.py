"""API tokens: create (the secret is shown once), list (never secrets), revoke. Admin only."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Path

from trimtab.api.auth import create_token
from trimtab.api.context import ApiContext
from trimtab.api.deps import NOT_FOUND, WRITE, get_ctx, require_scope
from trimtab.api.job_schemas import TokenCreatedOut, TokenIn, TokenOut, TokensOut
from trimtab.api.schemas_base import MAX_INT32
from trimtab.store import tokens as token_store
from trimtab.store.tokens import StoredToken

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])
ADMIN = Depends(require_scope("admin"))


def token_out(token: StoredToken) -> TokenOut:
    return TokenOut(id=token.id, name=token.name, scope=token.scope, created_ms=token.created_ms,
                    last_used_ms=token.last_used_ms, revoked=token.revoked, revoked_ms=token.revoked_ms)


@router.post("", response_model=TokenCreatedOut, status_code=201, responses=WRITE, summary="Create a token",
             description="Creates a token with a scope (agent: ingest; job: register and report jobs; admin: "
                         "everything) and returns its secret, once: only a hash is stored. Scope: admin.")
def create(body: TokenIn, ctx: ApiContext = Depends(get_ctx), _token=ADMIN) -> TokenCreatedOut:
    token, secret = create_token(ctx.engine, body.name, body.scope)
    return TokenCreatedOut(**token_out(token).model_dump(), token=secret)


@router.get("", response_model=TokensOut, responses=WRITE, summary="List tokens",
            description="Every token with its scope, creation and last use, and whether it is revoked; never the "
                        "secrets. Scope: admin.")
def list_tokens(ctx: ApiContext = Depends(get_ctx), _token=ADMIN) -> TokensOut:
    return TokensOut(tokens=[token_out(t) for t in token_store.list_tokens(ctx.engine)])


@router.delete("/{token_id}", response_model=TokenOut, responses={**WRITE, **NOT_FOUND}, summary="Revoke a token",
               description="Revokes the token at once (idempotent); its requests then get 401. Scope: admin.")
def revoke(token_id: int = Path(ge=1, le=MAX_INT32, description="The token's id."),
           ctx: ApiContext = Depends(get_ctx), _token=ADMIN) -> TokenOut:
    token = token_store.revoke(ctx.engine, token_id)
    if token is None:
        raise HTTPException(404, f"no token with id {token_id}")
    return token_out(token)
