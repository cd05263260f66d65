"""Ingest of agent batches (``trimtab agent --server``): validated, filed idempotently, fed to the snapshot."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Depends, Request
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from trimtab.contract.readings import MAX_CLOCK_AHEAD_S
from trimtab.api.batch_schema import BatchIn, IngestOut
from trimtab.api.context import ApiContext
from trimtab.api.deps import WRITE, get_ctx, require_scope
from trimtab.api.errors import invalid

router = APIRouter(prefix="/v1", tags=["ingest"])
log = logging.getLogger(__name__)


@router.post("/ingest", response_model=IngestOut, responses=WRITE, summary="Ingest an agent batch",
             description="A Batch as the agent serializes it (node, GPU inventory, GPU and host samples, processes, "
                         "events, per-link NVLink readings), at most the server's row limit, no timestamp more than "
                         f"{MAX_CLOCK_AHEAD_S} s ahead of the server's clock (422 naming the field; the node is still "
                         "listed in /v1/nodes with its clock skew, and a clock_skew event says why). Stored in one "
                         "transaction; rows already stored are skipped, so a replayed batch inserts 0. A store outage "
                         "answers 503 with Retry-After (the agent spools and retries). Scope: agent.")
def ingest(body: BatchIn, request: Request, ctx: ApiContext = Depends(get_ctx),
           _token=Depends(require_scope("agent"))) -> IngestOut:
    rows = body.row_count()
    if rows > ctx.max_batch_rows:
        raise invalid(("body",), f"{rows} rows in one batch; this server takes at most {ctx.max_batch_rows}")
    now_ms = int(time.time() * 1000)
    skew_ms = None if body.sent_ms is None else now_ms - body.sent_ms
    batch = body.to_batch()
    ahead = body.too_far_ahead(now_ms)
    if ahead is not None:  # refused, but the node is not forgotten: listed with its skew, and an event says why
        _note_clock(request, batch, now_ms, skew_ms, refused=ahead[1])
        raise invalid(*ahead)
    with request.app.state.writers.writer() as writer:
        try:
            result = writer.write(batch, now_ms, skew_ms)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            # The connection the writer held between batches died (the store restarted): the writer has dropped
            # it and the transaction rolled back, so once more on a fresh connection is safe (and idempotent).
            result = writer.write(batch, now_ms, skew_ms)
    ctx.snapshot.update(batch, body.sent_ms)  # only once stored: /metrics must not show what the store refused
    _note_clock(request, batch, now_ms, skew_ms)
    return IngestOut(inserted=result.total_inserted, duplicates=result.duplicates,
                     gpu_samples_inserted=result.gpu_samples_inserted,
                     host_samples_inserted=result.host_samples_inserted,
                     processes_inserted=result.processes_inserted, events_inserted=result.events_inserted,
                     nvlink_samples_inserted=result.nvlink_samples_inserted)


def _note_clock(request: Request, batch, now_ms: int, skew_ms, refused=None) -> None:
    """The node's clock as this server sees it (trimtab.store.clocks); a failure to note it fails no batch."""
    try:
        request.app.state.clocks.heard(batch.node, now_ms, skew_ms, refused)
    except SQLAlchemyError as exc:
        log.warning("could not note the clock of node %s: %s", batch.node.hostname, exc)
