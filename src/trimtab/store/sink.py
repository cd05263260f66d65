"""The agent's sink into a store it writes itself (SQLite / PostgreSQL): the store's side of the agent's
:class:`~trimtab.contract.sink.Sink` protocol, so the agent never imports the store (whoever wires the process
hands it this sink, or an HTTP one).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from trimtab.contract.readings import Batch, ahead_of_clock_message, first_ahead_of_clock
from trimtab.contract.sink import BatchRefused, SinkMisconfigured, SinkUnavailable
from trimtab.store.clocks import NOTE_EVERY_MS, ClockBook, store_now_ms
from trimtab.store.engine import release_engine, shared_engine
from trimtab.store.errors import StoreError, mask_url, permanent_reason
from trimtab.store.ingest import BatchWriter
from trimtab.store.migrate import migrate
from trimtab.store.rollup import RetentionPolicy, Upkeep
from trimtab.store.sqlite_wal import is_disk_full, relieve_full_disk

log = logging.getLogger(__name__)
UPKEEP_EVERY_S = 60.0  # rollups and retention: the first a period after the agent starts, then every period


class StoreSink:
    """Writes straight into a store through SQLAlchemy. Connects lazily, so an agent can start while its
    PostgreSQL is still down and spool until it comes up. Shares the process's engine for its URL (`trimtab up`:
    the API's), and runs the store's upkeep when the writer gives it the chance."""

    def __init__(self, url: str, retention: Optional[RetentionPolicy] = None,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000):
        self.url = url
        self.description = f"store {mask_url(url)}"
        self._upkeep = Upkeep(UPKEEP_EVERY_S, retention, first_after_s=UPKEEP_EVERY_S)
        self._engine = None
        self._writer = None
        self._clocks: Optional[ClockBook] = None
        self._clock_ms = clock_ms  # this node's wall clock (injectable: bench/clock_steps.py steps it)
        self._clock_due = 0.0  # monotonic s when the store's clock is asked again
        self._store_minus_monotonic_ms = 0

    def _connect(self) -> BatchWriter:
        if self._writer is None:  # first use, or written to again after close()
            engine = None
            try:
                engine = shared_engine(self.url)
                migrate(engine)
            except StoreError as exc:
                self._let_go(engine)
                raise (SinkMisconfigured if exc.permanent else SinkUnavailable)(str(exc)) from exc
            except (SQLAlchemyError, OSError) as exc:
                self._let_go(engine)
                raise SinkUnavailable(str(exc)) from exc
            self._engine, self._writer = engine, BatchWriter(engine)
            self._clocks, self._clock_due = ClockBook(engine), 0.0
        return self._writer

    @staticmethod
    def _let_go(engine) -> None:
        if engine is not None:
            release_engine(engine)

    def write(self, batch: Batch) -> int:
        """Store ``batch``; one dated more than MAX_CLOCK_AHEAD_S ahead of the store's clock is refused
        (:class:`BatchRefused`: the writer keeps it aside), as a server's ingest refuses it."""
        writer = self._connect()
        dbapi = self._engine.dialect.loaded_dbapi
        try:
            now_ms, skew_ms = self._store_clock()
            ahead = first_ahead_of_clock(batch, now_ms)
            if ahead is not None:
                part, i, ts_ms = ahead
                why = f"{part}[{i}]: " + ahead_of_clock_message(ts_ms, now_ms, "the store's")
                self._note_clock(batch, now_ms, skew_ms, why)
                raise BatchRefused(why)
            result = writer.write(batch, now_ms, skew_ms)
        except (OperationalError, dbapi.OperationalError, dbapi.InterfaceError) as exc:
            # The raw DB-API errors come from checking out a connection (server down, refused, reset).
            if is_disk_full(exc):  # SQLite on a full disk: free what can be freed and say so; retried later
                raise SinkUnavailable(relieve_full_disk(self._engine)) from exc
            raise SinkUnavailable(_short(exc)) from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise SinkUnavailable(_short(exc)) from exc
            if permanent_reason(exc) is not None:  # a file found damaged mid-run: no retry or later batch can help
                raise SinkMisconfigured(f"cannot write the store {mask_url(self.url)}: {permanent_reason(exc)} "
                                        f"({_short(exc)})") from exc
            raise
        self._note_clock(batch, now_ms, skew_ms)
        return result.total_inserted

    def _store_clock(self) -> tuple[int, int]:
        """(the store's clock now, its lead over this node's wall clock), epoch ms: PostgreSQL's server clock is the
        reference of agents that write it directly, as a server's is over HTTP. Asked once a minute and carried
        forward on the monotonic clock in between, so a step of this node's wall clock shows at once as skew."""
        mono_ms = time.monotonic_ns() // 1_000_000
        if time.monotonic() >= self._clock_due:
            self._clock_due = time.monotonic() + NOTE_EVERY_MS / 1000
            store_ms = store_now_ms(self._engine)
            self._store_minus_monotonic_ms = store_ms - (mono_ms + time.monotonic_ns() // 1_000_000) // 2
        now_ms = mono_ms + self._store_minus_monotonic_ms
        return now_ms, now_ms - self._clock_ms()

    def _note_clock(self, batch: Batch, now_ms: int, skew_ms: int, refused: Optional[str] = None) -> None:
        try:
            self._clocks.heard(batch.node, now_ms, skew_ms, refused)
        except SQLAlchemyError as exc:  # a note must not fail the batch it is about
            log.warning("could not note this node's clock in the store: %s", _short(exc))

    def open_now(self) -> None:
        """Open a SQLite store at once, so a damaged file stops the agent before it samples (one line, exit 78)
        rather than after its first batch. A SQLite file is on this machine: there is no outage to wait out.
        PostgreSQL stays lazy, so an agent may start while its server is still coming up.
        Raises :class:`SinkMisconfigured`; an error that may pass is left to the writer (it spools)."""
        if self.url.startswith("sqlite"):
            try:
                self._connect()
            except SinkUnavailable:
                pass

    def maintenance(self, now_ms: int) -> None:
        """The store's rollups and retention, when due (see :class:`~trimtab.store.rollup.Upkeep`)."""
        if self._engine is not None:
            self._upkeep.maybe_run(self._engine, now_ms)

    @property
    def engine(self):
        return self._engine

    def close(self) -> None:
        """Closes the writer and lets go of the engine (still readable through :attr:`engine`: reads reconnect)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            release_engine(self._engine)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return text[:limit]
