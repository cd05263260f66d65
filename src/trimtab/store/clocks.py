"""Each node's clock as the store's writers see it, and the events that make a node with a wrong one visible.

Every way into the store compares the sender's clock with the receiver's: a server with the clock a batch says it
was sent at (``sent_ms``), an agent writing the store itself with the store's clock (PostgreSQL's; a SQLite file's
is the node's own). A batch dated more than MAX_CLOCK_AHEAD_S ahead of the receiver is refused by both
(:func:`trimtab.contract.readings.first_ahead_of_clock`). Either way the node stays listed (``/v1/nodes``: when it
was last heard from, its skew, when a batch was last refused and why), and a ``clock_skew`` health event says so
when a batch is refused or the skew passes MAX_CLOCK_SKEW_S (and when it is back within). One small write a minute
per node at most unless one of those changes, so the ingest path pays nothing per batch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from sqlalchemy import Engine, func, select, text

from trimtab.contract.readings import EVENT_CLOCK_SKEW, MAX_CLOCK_SKEW_S, NodeInfo
from trimtab.store.ingest import _detail_hash
from trimtab.store.inserts import insert_for
from trimtab.store.models import gpu_samples, gpus, health_events, node_clocks, nodes
from trimtab.store.transactions import write_transaction

NOTE_EVERY_MS = 60_000  # a node's row is refreshed at least this often (heard_ms: "still sending")
SKEW_CHANGE_MS = 1_000  # … and whenever its skew moved by more than this
REFUSED_EVENT_EVERY_MS = 60_000  # at most one "refused" event a node this often (a backlog is refused batch by batch)
RECENT_MS = 5 * NOTE_EVERY_MS  # /healthz, check and /v1/balance speak of refusals this recent


@dataclass(frozen=True)
class NodeClock:
    hostname: str
    simulated: bool
    heard_ms: int  # receiver's clock when the node last sent (stored or refused)
    clock_skew_ms: Optional[int]  # receiver's clock − node's clock; None: not measured
    refused_ms: Optional[int]  # receiver's clock when a batch was last refused for its clock
    refused_detail: Optional[str]

    @property
    def clock_skew_s(self) -> Optional[float]:
        return None if self.clock_skew_ms is None else round(self.clock_skew_ms / 1000, 3)

    @property
    def off(self) -> bool:
        """The node's clock is further off the receiver's than MAX_CLOCK_SKEW_S."""
        return self.clock_skew_ms is not None and abs(self.clock_skew_ms) > MAX_CLOCK_SKEW_S * 1000

    def describe(self, now_ms: int) -> str:
        """One line: how far off the node's clock is, and what was refused in the last RECENT_MS (empty: neither)."""
        parts = []
        if self.off:
            way = "behind" if self.clock_skew_ms > 0 else "ahead of"
            parts.append(f"its clock is {abs(self.clock_skew_ms) / 1000:.0f} s {way} the receiver's "
                         f"(skew {self.clock_skew_s:+.3f} s)")
        if self.refused_ms is not None and self.refused_ms >= now_ms - RECENT_MS:
            parts.append(f"batches refused for their clock (last at {self.refused_ms}: {self.refused_detail})")
        return "; ".join(parts) + ": set its clock right (NTP)" if parts else ""


def skew_words(skew_ms: int) -> str:
    way = "behind" if skew_ms > 0 else "ahead of"
    return f"the node's clock is {abs(skew_ms) / 1000:.1f} s {way} the receiver's"


class ClockBook:
    """Notes what one writer hears of each node's clock (one per process and store: the server's ingest, an agent's
    store sink). Thread-safe; the write happens outside the lock."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._lock = threading.Lock()
        self._noted: dict[str, NodeClock] = {}  # hostname → what was last written

    def heard(self, node: NodeInfo, now_ms: int, skew_ms: Optional[int], refused: Optional[str] = None) -> None:
        """The node sent a batch at receiver time ``now_ms`` with clock skew ``skew_ms``; ``refused``: why the
        batch was refused for its clock (None: it was taken). A backlog refused batch by batch writes the row once
        a minute and one event, not one a batch. Raises the store's errors (callers log them: a note must not
        fail the batch it is about)."""
        with self._lock:
            prev = self._noted.get(node.hostname)
        refused_ms = now_ms if refused else (prev.refused_ms if prev else None)
        detail = refused[:512] if refused else (prev.refused_detail if prev else None)
        new = NodeClock(node.hostname, node.simulated, now_ms, skew_ms, refused_ms, detail)
        events = []
        if refused and (prev is None or prev.refused_ms is None or now_ms - prev.refused_ms >= REFUSED_EVENT_EVERY_MS):
            events.append(f"batch refused: {refused}" + (f"; {skew_words(skew_ms)}" if skew_ms is not None else ""))
        if new.off != (prev.off if prev else False):
            events.append(f"{skew_words(skew_ms)} (more than {MAX_CLOCK_SKEW_S:g} s): windows of its samples are off "
                          f"by as much" if new.off else f"the node's clock is back within {MAX_CLOCK_SKEW_S:g} s")
        due = (prev is None or events or now_ms - prev.heard_ms >= NOTE_EVERY_MS
               or (skew_ms is None) != (prev.clock_skew_ms is None)
               or (skew_ms is not None and abs(skew_ms - prev.clock_skew_ms) > SKEW_CHANGE_MS))
        if not due:
            return
        _write(self._engine, node, new, events)
        with self._lock:
            self._noted[node.hostname] = new


def _write(engine: Engine, node: NodeInfo, clock: NodeClock, events: list[str]) -> None:
    dialect = engine.dialect
    with write_transaction(engine) as conn:
        conn.execute(insert_for(dialect, nodes).on_conflict_do_nothing(index_elements=[nodes.c.hostname]).values(
            hostname=node.hostname, simulated=node.simulated, scenario=node.scenario,
            driver_version=node.driver_version, nvml_version=node.nvml_version,
            first_seen_ms=clock.heard_ms, last_seen_ms=clock.heard_ms))  # a node whose every batch is refused
        node_id = conn.execute(select(nodes.c.id).where(nodes.c.hostname == node.hostname)).scalar_one()
        values = {"heard_ms": clock.heard_ms, "clock_skew_ms": clock.clock_skew_ms, "refused_ms": clock.refused_ms,
                  "refused_detail": clock.refused_detail}
        stmt = insert_for(dialect, node_clocks).values(node_id=node_id, **values)
        conn.execute(stmt.on_conflict_do_update(index_elements=[node_clocks.c.node_id], set_=values))
        for detail in events:
            conn.execute(insert_for(dialect, health_events).on_conflict_do_nothing().values(
                node_id=node_id, gpu_id=None, gpu_uuid="", ts_ms=clock.heard_ms, kind=EVENT_CLOCK_SKEW, xid=None,
                detail=detail, detail_hash=_detail_hash(None, detail)))


def node_clocks_by_host(engine: Engine, hostname: Optional[str] = None) -> dict[str, NodeClock]:
    """What the store knows of the nodes' clocks (nodes never heard from by a writer of this version: absent)."""
    c = node_clocks.c
    query = select(nodes.c.hostname, nodes.c.simulated, c.heard_ms, c.clock_skew_ms, c.refused_ms,
                   c.refused_detail).join_from(node_clocks, nodes)
    if hostname is not None:
        query = query.where(nodes.c.hostname == hostname)
    with engine.connect() as conn:
        return {r.hostname: NodeClock(r.hostname, bool(r.simulated), *r[2:]) for r in conn.execute(query)}


def clocks_in_question(engine: Engine, now_ms: int) -> list[NodeClock]:
    """Nodes heard from in the last RECENT_MS whose clock is off, or whose batches were refused for it then."""
    return [n for n in node_clocks_by_host(engine).values() if n.heard_ms >= now_ms - RECENT_MS and n.describe(now_ms)]


_STORE_NOW_MS = {
    "postgresql": "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    "sqlite": "SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
}


def store_now_ms(engine: Engine) -> int:
    """The store's own clock, epoch ms: PostgreSQL's server clock (the reference of agents that write it
    directly), a SQLite file's the machine's."""
    with engine.connect() as conn:
        return int(conn.execute(text(_STORE_NOW_MS[engine.dialect.name])).scalar_one())


def newest_sample_ms(engine: Engine, hostname: str) -> Optional[int]:
    """The node's newest GPU sample time (one backwards step on each of its GPUs' keys), or None: none stored."""
    s = gpu_samples.c
    with engine.connect() as conn:
        ids = conn.execute(select(gpus.c.id).join_from(gpus, nodes).where(nodes.c.hostname == hostname)).scalars()
        newest = [conn.execute(select(func.max(s.ts_ms)).where(s.gpu_id == gpu_id)).scalar() for gpu_id in list(ids)]
    return max((t for t in newest if t is not None), default=None)
