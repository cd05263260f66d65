"""Ingest of agent batches (``trimtab agent --server``): validated, filed idempotently, fed to the snapshot."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from sqlalchemy.exc import DBAPIError

from trimtab.contract.readings import MAX_CLOCK_AHEAD_S
from trimtab.api.batch_schema import BatchIn, IngestOut
from trimtab.api.context import ApiContext
from trimtab.api.deps import WRITE, get_ctx, require_scope
from trimtab.api.errors import invalid

router = APIRouter(prefix="/v1", tags=["ingest"])


@router.post("/ingest", response_model=IngestOut, responses=WRITE, summary="Ingest an agent batch",
             description="A Batch as the agent serializes it (node, GPU inventory, GPU and host samples, processes, "
                         "events, per-link NVLink readings), at most the server's row limit, no timestamp more than "
                         f"{MAX_CLOCK_AHEAD_S} s ahead of the server's clock (422 naming the field). Stored in one "
                         "transaction; rows already stored are skipped, so a replayed batch inserts 0. A store outage "
                         "answers 503 with Retry-After (the agent spools and retries). Scope: agent.")
def ingest(body: BatchIn, request: Request, ctx: ApiContext = Depends(get_ctx),
           _token=Depends(require_scope("agent"))) -> IngestOut:
    rows = body.row_count()
    if rows > ctx.max_batch_rows:
        raise invalid(("body",), f"{rows} rows in one batch; this server takes at most {ctx.max_batch_rows}")
    ahead = body.too_far_ahead(int(time.time() * 1000))
    if ahead is not None:
        raise invalid(*ahead)
    batch = body.to_batch()
    with request.app.state.writers.writer() as writer:
        try:
            result = writer.write(batch)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            # The connection the writer held between batches died (the store restarted): the writer has dropped
            # it and the transaction rolled back, so once more on a fresh connection is safe (and idempotent).
            result = writer.write(batch)
    ctx.snapshot.update(batch)  # only once stored: /metrics must not show what the store refused
    return IngestOut(inserted=result.total_inserted, duplicates=result.duplicates,
                     gpu_samples_inserted=result.gpu_samples_inserted,
                     host_samples_inserted=result.host_samples_inserted,
                     processes_inserted=result.processes_inserted, events_inserted=result.events_inserted,
                     nvlink_samples_inserted=result.nvlink_samples_inserted)
