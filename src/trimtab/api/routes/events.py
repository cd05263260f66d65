"""Health events (lost GPUs, XIDs, failing sources, dropped spool data), newest first, a page at a time."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Query

from trimtab.api.context import ApiContext
from trimtab.api.deps import READ, Page, get_ctx, page
from trimtab.api.errors import invalid
from trimtab.api.routes.gpus import node_query
from trimtab.api.schemas import EventOut, EventsOut
from trimtab.api.schemas_base import EVENT_KIND, MAX_EPOCH_MS
from trimtab.store.events import event_page
from trimtab.store.jobs import only_simulated

router = APIRouter(prefix="/v1", tags=["telemetry"])


@router.get("/events", response_model=EventsOut, responses=READ, summary="List health events",
            description="Health events in [start_ms, end_ms) (either bound optional), optionally of one node and "
                        "kind, newest first; page with limit/offset (next_offset is null on the last page).")
def events(start_ms: Optional[int] = Query(None, ge=0, le=MAX_EPOCH_MS, description="From, epoch ms (inclusive)."),
           end_ms: Optional[int] = Query(None, ge=0, le=MAX_EPOCH_MS, description="Until, epoch ms (exclusive)."),
           node: Optional[str] = node_query(),
           kind: Optional[str] = Query(None, max_length=32, pattern=EVENT_KIND,
                                       description="Only this kind: gpu_lost, xid, source_error, spool_dropped."),
           pages: Page = Depends(page), ctx: ApiContext = Depends(get_ctx)) -> EventsOut:
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise invalid(("query", "end_ms"), "end_ms must not be before start_ms")
    rows, next_offset = pages.cut(event_page(ctx.engine, start_ms, end_ms, node, kind, pages.fetch(), pages.offset))
    out = [EventOut(id=e.id, hostname=e.hostname, simulated=sim, ts_ms=e.ts_ms, kind=e.kind, gpu_uuid=e.gpu_uuid,
                    xid=e.xid, detail=e.detail) for e, sim in rows]
    simulated = any(e.simulated for e in out) or only_simulated(ctx.engine, node)
    return EventsOut(simulated=simulated, events=out, next_offset=next_offset)
