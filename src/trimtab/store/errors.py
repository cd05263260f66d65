"""What the store raises when it cannot be used (:class:`StoreError`), whether waiting could cure it, and the
words it says: the driver's own, or what to do, with the URL's password masked.

One place for these so the engine, the migration and the sink (which retries outages and gives up on the
permanent kind) agree on which failures are outages and how a store URL may be logged.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError


class StoreError(RuntimeError):
    """The store cannot be used: a malformed or unsupported URL, an unreachable server, a failed migration.
    The message names the URL (password masked) and what failed. ``permanent``: waiting will not help (a database
    or schema that does not exist, refused credentials, a URL trimtab cannot use); else it may be an outage."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


# Errors that no retry can cure, by SQLSTATE (class or code) and, for errors PostgreSQL sends while the connection
# is being made (libpq reports those without a SQLSTATE), by the server's words; each with what to do about it.
_PERMANENT_SQLSTATES = {"3D000": "the database does not exist", "3F000": "the schema does not exist",
                        "28000": "the server refused these credentials", "28P01": "the server refused these credentials",
                        "42501": "the user lacks a privilege trimtab needs"}
_PERMANENT_MESSAGES = (
    (re.compile(r'database "([^"]+)" does not exist'),
     "the database {0} does not exist: create it (createdb {0}) or fix the database name in the URL"),
    (re.compile(r"no schema has been selected to create in|schema \"?([^\" ]*)\"? does not exist"),
     "the schema selected by search_path does not exist: create it first (CREATE SCHEMA name;), or drop the "
     "URL's options=-csearch_path to use public"),
    (re.compile(r'role "([^"]+)" does not exist'), "the user {0} does not exist on that server: fix the URL's user"),
    (re.compile(r"password authentication failed|no pg_hba\.conf entry|authentication failed"),
     "the server refused these credentials: fix the URL's user/password (or the server's pg_hba.conf)"),
    (re.compile(r"permission denied"), "the user lacks a privilege trimtab needs (it creates and alters its tables): "
                                       "grant it, or use the owner of the database"),
    # SQLite's SQLITE_NOTADB and SQLITE_CORRUPT: the file is damaged (truncated, overwritten), not busy or away.
    (re.compile(r"file is not a database|database disk image is malformed"),
     "the file is damaged, not a SQLite database trimtab can use; it is left as it is: restore it from a copy, or "
     "move it aside and trimtab starts a new store"),
)


def permanent_reason(exc: BaseException) -> str | None:
    """Why a store error will not go away by waiting, with what to do; None when it may be an outage."""
    orig = getattr(exc, "orig", None) or exc
    words = " ".join(str(orig).split())
    for pattern, advice in _PERMANENT_MESSAGES:
        found = pattern.search(words)
        if found:
            return advice.format(*(g or "" for g in found.groups()))
    return _PERMANENT_SQLSTATES.get(getattr(orig, "sqlstate", None) or "")


def mask_url(url: str | URL) -> str:
    """The URL as it can be logged: the password replaced by ``***`` (also for text that does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


def store_error(what: str, exc: BaseException, permanent: bool = False) -> StoreError:
    """``what: <the driver's words>``; for an error waiting cannot cure, what to do about it instead of the SQL."""
    advice = permanent_reason(exc)
    if advice is None:
        return StoreError(f"{what}: {driver_words(exc)}", permanent=permanent)
    return StoreError(f"{what}: {advice} ({driver_words(exc).split(' LINE ')[0]})", permanent=True)


def driver_words(exc: BaseException) -> str:
    """The driver's own words, on one line, without SQLAlchemy's statement dump and background link."""
    orig = getattr(exc, "orig", None)
    return " ".join(str(orig if orig is not None else exc).split()) or type(exc).__name__
