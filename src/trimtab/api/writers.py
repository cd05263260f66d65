"""A small pool of :class:`~trimtab.store.ingest.BatchWriter`s shared by ingest requests.

A writer holds a pooled connection between batches, so one per request thread (up to 40 in the thread pool)
would exhaust a PostgreSQL pool; SQLite takes one writer at a time anyway. Requests borrow a writer and give it
back; when all are busy they wait, and past ``wait_s`` get a 503 (the agent spools and retries).
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import Engine

from trimtab.store.ingest import BatchWriter


class StoreBusy(RuntimeError):
    """Every writer stayed busy for the whole wait: the store cannot keep up right now."""


def default_writer_count(engine: Engine) -> int:
    return 1 if engine.dialect.name == "sqlite" else 4  # PostgreSQL's default pool holds 5 connections


class WriterPool:
    def __init__(self, engine: Engine, size: int, wait_s: float = 10.0):
        self._engine = engine
        self._size = max(1, size)
        self._wait_s = wait_s
        self._free: queue.LifoQueue[BatchWriter] = queue.LifoQueue()
        self._created = 0
        self._lock = threading.Lock()

    @contextmanager
    def writer(self) -> Iterator[BatchWriter]:
        writer = self._take()
        try:
            yield writer
        finally:
            self._free.put(writer)

    def _take(self) -> BatchWriter:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._created < self._size:
                self._created += 1
                return BatchWriter(self._engine)
        try:
            return self._free.get(timeout=self._wait_s)
        except queue.Empty:
            raise StoreBusy(f"all {self._size} store writers busy for {self._wait_s:g} s") from None

    def close(self) -> None:
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                return
