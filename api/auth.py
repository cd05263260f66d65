"""Bearer tokens: high-entropy secrets handed out once, kept only as SHA-256 digests, with scopes.

Scopes: ``agent`` may ingest, ``job`` may register and report its jobs, ``admin`` may do everything (it implies the
other two). A plain SHA-256 is enough because the secrets are random 256-bit strings, not passwords: there is
nothing to brute-force, so a slow KDF would only slow every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from pathlib import Path
from typing import Optional

from sqlalchemy import Engine

from trimtab.paths import private_dir, write_private_file
from trimtab.store import tokens as token_store
from trimtab.store.tokens import StoredToken

SECRET_PREFIX = "tt_"  # recognisable in a leaked config or log (secret scanners key on prefixes)
ADMIN_TOKEN_FILE = "admin.token"
TOUCH_EVERY_S = 60.0  # last_used is a write: at most one per token a minute


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def allows(token_scope: str, needed: str) -> bool:
    return token_scope == "admin" or token_scope == needed


def create_token(engine: Engine, name: str, scope: str) -> tuple[StoredToken, str]:
    """A new token and its secret (the only time the secret exists outside the client)."""
    secret = new_secret()
    return token_store.add_token(engine, name, scope, hash_secret(secret)), secret


def any_tokens(engine: Engine) -> bool:
    """Whether any token (even revoked) exists: the daemon refuses a non-loopback bind before the first one."""
    return token_store.count_tokens(engine) > 0


def ensure_admin_token(engine: Engine, state_dir: Path) -> Optional[Path]:
    """On a store without an active admin token (first start, or every admin token revoked), create one and
    write its secret to ``<state_dir>/admin.token`` (mode 0600). Returns the file's path, or None when an admin
    token exists.

    The file is written (under a temporary name) before the token is stored: a crash in between leaves an unused
    file, never a stored admin token whose secret nobody has. The directory is created 0700, the file 0600, and a
    symlink at the file's name is replaced, not followed (:func:`trimtab.paths.write_private_file`).
    """
    if token_store.count_tokens(engine, scope="admin", active_only=True) > 0:
        return None
    path = private_dir(Path(state_dir)) / ADMIN_TOKEN_FILE
    secret = new_secret()
    write_private_file(path, secret + "\n", before_replace=lambda: token_store.add_token(
        engine, "admin (created at first start)", "admin", hash_secret(secret)))
    return path


class Authenticator:
    """Finds the active token of a presented secret and records its use (throttled)."""

    def __init__(self, engine: Engine, touch_every_s: float = TOUCH_EVERY_S):
        self._engine = engine
        self._touch_every_s = touch_every_s
        self._touched: dict[int, float] = {}  # token id → monotonic time of the last recorded use
        self._lock = threading.Lock()

    def authenticate(self, secret: str) -> Optional[StoredToken]:
        digest = hash_secret(secret)
        found = token_store.find_active(self._engine, digest)
        # The store found the row by digest; compare again in constant time so no code path leaks timing.
        if found is None or not hmac.compare_digest(found[1], digest):
            return None
        token = found[0]
        now = time.monotonic()
        with self._lock:
            due = now - self._touched.get(token.id, -1e18) >= self._touch_every_s
            if due:
                self._touched[token.id] = now
        if due:
            token_store.touch(self._engine, token.id)
        return token
