"""Which server plans: a lease row in the store (``planner_lease``, migration 0015), so that several `trimtab
server`s on one PostgreSQL serve ingest and reads together while exactly one plans, and another takes over within
seconds of its death (issue 39).

A lease row with an expiry rather than a PostgreSQL advisory lock held on a session connection, because:

* it fences. Each takeover raises the row's ``epoch``; every decision is written in a transaction that first locks
  the row (``SELECT … FOR UPDATE``) and finds its own holder and epoch there (:meth:`Leadership.fence`). A former
  leader that lost the lease — paused (SIGSTOP, a long GC, a VM stall), cut off, or still finishing a plan — cannot
  write one more decision: a takeover waits for the row lock of a decision in flight, and a decision after it finds
  another epoch. An advisory lock says who holds it *now*, and a check of it in another connection's transaction
  races its loss.
* a stopped process loses it. A SIGSTOPped leader keeps its session, and its advisory lock, for ever; its lease
  expires in :data:`LEASE_S`.
* it works the same on SQLite (one file, one machine: a second server on it serves ingest and reads without
  planning, and says so) and needs no connection held outside the pool.

Time is the database's (PostgreSQL's ``clock_timestamp()``), so servers with skewed clocks agree on expiry. The
leader renews every :data:`RENEW_S`; it stops planning on its own once a renewal is :data:`LEASE_S` late (its
local deadline starts before the renewal is sent, so it ends before the row's). A follower tries every
:data:`RENEW_S`: after a kill -9 it takes over at most LEASE_S + RENEW_S later, and plans at its next sweep.
A clean stop releases the lease at once.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Optional

from trimtab.store import decisions as decision_store
from trimtab.store import lease as lease_store

log = logging.getLogger("trimtab.control")
LEASE_S = 5.0  # a lease not renewed for this long is free to take
RENEW_S = 1.0  # how often the leader renews it and a follower tries to take it


class NotLeading(RuntimeError):
    """A decision write refused: this server does not hold the planner's lease (another took over)."""


class Leadership:
    """This server's claim on the planner's lease; :attr:`leading` says whether it may plan now."""

    def __init__(self, engine: Any, label: str = "", lease_s: float = LEASE_S, renew_s: float = RENEW_S):
        if not 0 < renew_s < lease_s:
            raise ValueError(f"renew_s ({renew_s}) must be positive and shorter than lease_s ({lease_s})")
        self.engine, self.lease_s, self.renew_s = engine, lease_s, renew_s
        where = label or socket.gethostname()
        self.holder = f"{where} pid {os.getpid()} {secrets.token_hex(3)}"[:200]
        self.epoch: Optional[int] = None  # the epoch this server holds, while it does
        self.term = 0  # how many times this server took the lease
        self._valid_until = 0.0  # time.monotonic() until which the lease is surely ours
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._warned_sqlite = False
        self.last_error: Optional[str] = None

    # -- the claim ---------------------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.epoch is not None and time.monotonic() < self._valid_until

    def tick(self) -> bool:
        """Renew the lease if held, else try to take it; whether this server leads after it."""
        sent = time.monotonic()
        try:
            epoch, other = lease_store.take_or_renew(self.engine, self.holder, self.epoch, int(self.lease_s * 1000))
        except Exception as exc:  # noqa: BLE001 - a store outage: the lease runs out on its own, we try again
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if self.epoch is not None and time.monotonic() >= self._valid_until:
                self._lost(f"it could not be renewed for {self.lease_s:g} s ({self.last_error})")
            return self.leading
        self.last_error = None
        if epoch is None:
            if self.epoch is not None:
                self._lost("another server took the lease")
            self._follow(other)
            return False
        if self.epoch is None:
            self.term += 1
            log.warning("this server (%s) now plans: it took the planner's lease, epoch %d", self.holder, epoch)
        self.epoch, self._valid_until = epoch, sent + self.lease_s
        return True

    def _lost(self, why: str) -> None:
        log.warning("this server (%s) stopped planning: %s", self.holder, why)
        self.epoch, self._valid_until = None, 0.0

    def _follow(self, other: Optional[str]) -> None:
        if other and self.engine.dialect.name == "sqlite" and not self._warned_sqlite:
            self._warned_sqlite = True
            log.warning("another trimtab process (%s) plans on this SQLite store: this one serves ingest and reads "
                        "without planning (SQLite is a single-server store: several servers need PostgreSQL)", other)

    def release(self) -> None:
        """Give the lease up now (a clean stop): another server takes over at its next try, not LEASE_S later."""
        if self.epoch is None:
            return
        epoch, self.epoch, self._valid_until = self.epoch, None, 0.0
        try:
            lease_store.release(self.engine, self.holder, epoch)
        except Exception as exc:  # noqa: BLE001 - it expires on its own
            log.warning("could not release the planner's lease (it expires in %g s): %s", self.lease_s, exc)

    # -- the fence ---------------------------------------------------------------------------------------------

    def fence(self, conn: Any) -> None:
        """Inside a decision's transaction, before it writes: lock the lease row and find this server's epoch in
        it, else raise :class:`NotLeading` (the transaction rolls back). A takeover (an UPDATE of the row) waits
        for this transaction, and one that came first makes this one fail: no decision is written twice."""
        epoch = self.epoch
        if epoch is None or not lease_store.holds(conn, self.holder, epoch):
            raise NotLeading(f"this server ({self.holder}) does not hold the planner's lease: decision not written")

    def fenced_writes(self) -> "FencedWrites":
        return FencedWrites(self.fence)

    # -- running -----------------------------------------------------------------------------------------------

    def start(self, label: Optional[str] = None) -> "Leadership":
        """Take or follow the lease from now on (``label``: where this server answers, named in ``holder``)."""
        if label:
            self.holder = f"{label} pid {os.getpid()} {secrets.token_hex(3)}"[:200]
        self.tick()
        self._thread = threading.Thread(target=self._run, name="trimtab-leadership", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.release()

    def status(self) -> dict[str, Any]:
        """Which server plans (from the store), and whether it is this one: for /healthz and /v1/planner."""
        out = lease_status(self.engine, self.holder, self.leading)
        if self.last_error:
            out["last_error"] = self.last_error
        return out


def lease_status(engine: Any, this_server: Optional[str] = None, this_server_plans: bool = False) -> dict[str, Any]:
    """The lease as a server reports it: the planning server (None while nobody holds a live lease), its epoch,
    since when and for how much longer; ``this_server``: the asking server's own name, if it takes part."""
    out: dict[str, Any] = {"this_server": this_server, "this_server_plans": this_server_plans}
    try:
        row, now = lease_store.read_lease(engine)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: this feeds the health probe
        return {**out, "planning_server": None, "epoch": 0, "error": f"{type(exc).__name__}: {exc}"[:300]}
    live = row is not None and row.holder is not None and row.expires_ms >= now
    out.update(planning_server=row.holder if live else None, epoch=row.epoch if row else 0,
               since_ms=row.since_ms if live else None, expires_in_ms=(row.expires_ms - now) if live else None)
    return out


class FencedWrites:
    """The decision store's write functions, each with the lease's fence run first in its transaction."""

    def __init__(self, fence: Callable[[Any], None]) -> None:
        self._fence = fence

    def __getattr__(self, name: str) -> Callable[..., Any]:
        from trimtab.control.plan_writes import WRITES

        if name not in WRITES:
            raise AttributeError(name)
        return functools.partial(getattr(decision_store, name), fence=self._fence)
