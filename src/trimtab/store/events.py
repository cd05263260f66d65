"""Health events a page at a time, filtered by time, node and kind, for the API's paginated listing.

(:func:`trimtab.store.queries.health_events` serves the CLI's "latest N"; an API client pages with offsets.)
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy import Engine, select

from trimtab.store.models import health_events, nodes
from trimtab.store.queries import StoredEvent


def event_page(engine: Engine, start_ms: Optional[int] = None, end_ms: Optional[int] = None,
               hostname: Optional[str] = None, kind: Optional[str] = None, limit: int = 100,
               offset: int = 0) -> list[tuple[StoredEvent, bool]]:
    """Events in ``[start_ms, end_ms)``, newest first: (event, whether its node is simulated)."""
    e = health_events.c
    query = select(e.id, nodes.c.hostname, e.ts_ms, e.kind, e.gpu_uuid, e.xid, e.detail,
                   nodes.c.simulated).join_from(health_events, nodes)
    if start_ms is not None:
        query = query.where(e.ts_ms >= start_ms)
    if end_ms is not None:
        query = query.where(e.ts_ms < end_ms)
    if hostname is not None:
        query = query.where(nodes.c.hostname == hostname)
    if kind is not None:
        query = query.where(e.kind == kind)
    query = query.order_by(e.ts_ms.desc(), e.id.desc()).limit(limit).offset(offset)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [(StoredEvent(r.id, r.hostname, r.ts_ms, r.kind, r.gpu_uuid or None, r.xid, r.detail), bool(r.simulated))
            for r in rows]
