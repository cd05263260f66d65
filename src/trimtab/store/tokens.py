"""API bearer tokens in the store: only their SHA-256 digests are kept, with name, scope and use times.

Hashing and secret generation belong to :mod:`trimtab.api.auth`; this module files and finds digests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Engine, bindparam, func, insert, select, update

from trimtab.store.models import api_tokens
from trimtab.store.transactions import write_transaction
from trimtab.store.wall_clock import now_ms as wall_ms

SCOPES = ("agent", "job", "admin")


@dataclass(frozen=True)
class StoredToken:
    id: int
    name: str
    scope: str
    created_ms: int
    last_used_ms: Optional[int]
    revoked_ms: Optional[int]

    @property
    def revoked(self) -> bool:
        return self.revoked_ms is not None


_COLUMNS = (api_tokens.c.id, api_tokens.c.name, api_tokens.c.scope, api_tokens.c.created_ms,
            api_tokens.c.last_used_ms, api_tokens.c.revoked_ms)



def add_token(engine: Engine, name: str, scope: str, secret_sha256: str) -> StoredToken:
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    now = wall_ms()
    with write_transaction(engine) as conn:
        token_id = conn.execute(insert(api_tokens).values(name=name, scope=scope, secret_sha256=secret_sha256,
                                                          created_ms=now).returning(api_tokens.c.id)).scalar_one()
    return StoredToken(token_id, name, scope, now, None, None)


# Every request reads its token: the statement is built once (its construction cost more than the query).
_ACTIVE_BY_DIGEST = select(*_COLUMNS, api_tokens.c.secret_sha256).where(
    api_tokens.c.secret_sha256 == bindparam("digest"), api_tokens.c.revoked_ms.is_(None))


def find_active(engine: Engine, secret_sha256: str) -> Optional[tuple[StoredToken, str]]:
    """The unrevoked token with this digest and the digest as stored (for a constant-time comparison), or None."""
    with engine.connect() as conn:
        row = conn.execute(_ACTIVE_BY_DIGEST, {"digest": secret_sha256}).first()
    return None if row is None else (StoredToken(*row[:-1]), row[-1])


def find_any(engine: Engine, secret_sha256: str) -> Optional[StoredToken]:
    """The token with this digest, revoked or not, or None."""
    with engine.connect() as conn:
        row = conn.execute(select(*_COLUMNS).where(api_tokens.c.secret_sha256 == secret_sha256)).first()
    return None if row is None else StoredToken(*row)


def touch(engine: Engine, token_id: int, now_ms: Optional[int] = None) -> None:
    """Record a use of the token (callers throttle this: it is a write)."""
    with write_transaction(engine) as conn:
        conn.execute(update(api_tokens).where(api_tokens.c.id == token_id)
                     .values(last_used_ms=now_ms if now_ms is not None else wall_ms()))


def list_tokens(engine: Engine) -> list[StoredToken]:
    with engine.connect() as conn:
        return [StoredToken(*row) for row in conn.execute(select(*_COLUMNS).order_by(api_tokens.c.id))]


def revoke(engine: Engine, token_id: int) -> Optional[StoredToken]:
    """Revoke the token (idempotent: an already revoked token keeps its revocation time); None if unknown."""
    with write_transaction(engine) as conn:
        conn.execute(update(api_tokens).where(api_tokens.c.id == token_id, api_tokens.c.revoked_ms.is_(None))
                     .values(revoked_ms=wall_ms()))
        row = conn.execute(select(*_COLUMNS).where(api_tokens.c.id == token_id)).first()
    return None if row is None else StoredToken(*row)


def count_tokens(engine: Engine, scope: Optional[str] = None, active_only: bool = False) -> int:
    query = select(func.count()).select_from(api_tokens)
    if scope is not None:
        query = query.where(api_tokens.c.scope == scope)
    if active_only:
        query = query.where(api_tokens.c.revoked_ms.is_(None))
    with engine.connect() as conn:
        return conn.execute(query).scalar_one()
