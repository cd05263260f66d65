"""The accumulated ledger behind /metrics' GPU-time counters, advanced on a timer of the server's own, never on a
scrape: a scrape reads the accumulated table and nothing else (on main at ef53228 each scrape advanced every live
job first and paid 1.15x a scrape without the counters; bench/gpu_ledger.py).

Each tick calls :func:`trimtab.grading.ledger.read.advance_ledgers` on the store's jobs at the time of the tick. The
advance is a compare-and-set in the store (how far each job is accumulated is stored with its cells, in one
transaction), so the counters stay monotonic and exact across restarts and with several servers ticking on one
PostgreSQL: whichever advances a job first adds its time, the others add nothing for it that tick. A counter thus
lags now by up to the tick period plus the ledger's settling lag (``SETTLE_MS``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from sqlalchemy import Engine

from trimtab.grading.ledger.read import advance_ledgers
from trimtab.store import jobs as job_store

log = logging.getLogger("trimtab.ledger")
MAX_JOBS = 10_000        # jobs one tick advances (the store's whole list of jobs, in practice)
DEFAULT_PERIOD_S = 15.0  # a Prometheus scrape interval: a scrape sees at most one tick's time more than the last


def now_ms() -> int:
    return int(time.time() * 1000)


def advance_all(engine: Engine, at_ms: Optional[int] = None) -> int:
    """Advances every job's accumulated ledger to ``at_ms`` (now: None); returns how many jobs advanced."""
    return advance_ledgers(engine, job_store.list_jobs(engine, MAX_JOBS, 0), now_ms() if at_ms is None else at_ms)


class LedgerTicker:
    """A daemon thread that advances the accumulated ledger every ``period_s``. A tick that raises (store down)
    is logged and counted, and the next tick goes on from where the store says the ledger is."""

    def __init__(self, engine: Engine, period_s: float = DEFAULT_PERIOD_S,
                 clock: Callable[[], int] = now_ms) -> None:
        if period_s <= 0:
            raise ValueError(f"the ledger's tick period must be positive, not {period_s}")
        self.engine, self.period_s, self.clock = engine, period_s, clock
        self.ticks = self.failures = 0
        self.last_error: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trimtab-ledger", daemon=True)

    def tick(self) -> int:
        try:
            advanced = advance_all(self.engine, self.clock())
        except Exception as exc:  # noqa: BLE001 — a store outage must not end the thread; the next tick retries
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("the GPU-time ledger did not advance: %s", self.last_error)
            return 0
        self.ticks += 1
        self.last_error = None
        return advanced

    def _run(self) -> None:
        self.tick()  # at once: after a restart the counters catch up from where the store says they are
        while not self._stop.wait(self.period_s):
            self.tick()

    def start(self) -> "LedgerTicker":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def health(self) -> dict:
        return {"state": "failing" if self.last_error else "ok", "period_s": self.period_s,
                "ticks": self.ticks, "failures": self.failures, "last_error": self.last_error}
