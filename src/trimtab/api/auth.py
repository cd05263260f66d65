"""Bearer tokens: high-entropy secrets handed out once, kept only as SHA-256 digests, with scopes.

Scopes: ``agent`` may ingest, ``job`` may register and report its jobs, ``admin`` may do everything (it implies the
other two). A plain SHA-256 is enough because the secrets are random 256-bit strings, not passwords: there is
nothing to brute-force, so a slow KDF would only slow every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Optional

from sqlalchemy import Engine

from trimtab.paths import BadToken, private_dir, read_token_file, write_private_file
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


class TokenFileConflict(RuntimeError):
    """An admin token file exists that this store does not know: it belongs to another store and is never replaced."""


def admin_token_path(engine: Engine, state_dir: Path) -> Path:
    """Where the first admin token of the store behind ``engine`` goes: ``<state_dir>/admin.token`` for the state
    directory's own store (``<state_dir>/trimtab.db``), else ``admin-<database>-<8 hex of the URL>.token``, so two
    stores sharing a state directory never share (or overwrite) a token file."""
    url = engine.url
    own = Path(state_dir) / "trimtab.db"
    if url.get_backend_name() == "sqlite" and url.database and Path(url.database).resolve() == own.resolve():
        return Path(state_dir) / ADMIN_TOKEN_FILE
    name = Path(url.database or "memory").stem if url.get_backend_name() == "sqlite" else (url.database or url.host)
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name or "store"))[:40]
    digest = hashlib.sha256(url.set(password=None).render_as_string(hide_password=False).encode()).hexdigest()[:8]
    return Path(state_dir) / f"admin-{label}-{digest}.token"


def _known_here(engine: Engine, path: Path) -> bool:
    """Whether ``path`` holds a secret of this store (revoked or not): only then may it be replaced."""
    try:
        digest = hash_secret(read_token_file(path))
    except BadToken:
        return False
    return token_store.find_any(engine, digest) is not None


def ensure_admin_token(engine: Engine, state_dir: Path) -> Optional[Path]:
    """On a store without an active admin token (first start, or every admin token revoked), create one and
    write its secret to :func:`admin_token_path` (mode 0600). Returns the file's path, or None when an admin
    token exists.

    A file that is already there is replaced only when it holds one of this store's own (revoked) tokens; any
    other file belongs to another store, and :class:`TokenFileConflict` says so instead of destroying its secret.
    The file is written (under a temporary name) before the token is stored: a crash in between leaves an unused
    file, never a stored admin token whose secret nobody has. The directory is created 0700, the file 0600, and a
    symlink at the file's name is replaced, not followed (:func:`trimtab.paths.write_private_file`).
    """
    if token_store.count_tokens(engine, scope="admin", active_only=True) > 0:
        return None
    path = admin_token_path(engine, private_dir(Path(state_dir)))
    if (path.exists() or path.is_symlink()) and not _known_here(engine, path):
        from trimtab.store.errors import mask_url

        raise TokenFileConflict(
            f"{path} already holds an admin token that the store {mask_url(engine.url)} does not know: it belongs to "
            f"another store (one that used this file before, e.g. a store at the same place deleted and created "
            f"anew), and trimtab never overwrites a token file. Move the file away if that store is gone, or give "
            f"this store a state directory of its own (--state-dir)")
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
