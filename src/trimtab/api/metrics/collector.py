"""The collector behind ``GET /metrics``: reads the API context on every scrape and renders it; holds no values
between scrapes (the scrape-error counter aside)."""

from __future__ import annotations

from typing import Iterator, Optional

from prometheus_client.core import Metric

from trimtab.api.context import ApiContext
from trimtab.api.metrics.gpus import gpu_families, link_families
from trimtab.api.metrics.jobs import job_families
from trimtab.api.metrics.ledger import ledger_families
from trimtab.api.metrics.nodes import BALANCE_WINDOW_S, balance_families, node_families
from trimtab.api.metrics.render import text_exposition
from trimtab.api.metrics.scrape_errors import error_families, guarded
from trimtab.api.metrics.store_reads import JobScrape, read_jobs, read_store

# What render_metrics returns; spelled out because prometheus_client's CONTENT_TYPE_LATEST moved to 1.0.0.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def job_metric_families(ctx: ApiContext, data: Optional[JobScrape] = None) -> Iterator[Metric]:
    """Job metrics (``trimtab_job_*``) and rebalancer decisions (``trimtab_rebalancer_*``) from the store; ``data``
    when the scrape has read it already."""
    yield from job_families(data if data is not None else read_jobs(ctx.engine, ctx.rules))


class TrimtabCollector:
    """A prometheus_client collector reading ``ctx`` on every ``collect()``; ``nvlink_links`` (None: the context's
    ``metrics_nvlink_links``) says whether the per-link NVLink series are in it."""

    def __init__(self, ctx: ApiContext, nvlink_links: Optional[bool] = None):
        self.ctx = ctx
        self.nvlink_links = ctx.metrics_nvlink_links if nvlink_links is None else nvlink_links

    def collect(self) -> Iterator[Metric]:
        ctx = self.ctx
        rows = guarded("gpus", ctx.latest_gpus)
        links = guarded("gpus", ctx.latest_links) if rows and self.nvlink_links else []
        store = guarded("balance", lambda: [read_store(ctx.engine, ctx.rules, BALANCE_WINDOW_S)])
        reports, jobs = store[0] if store else ([], None)
        simulated = {r.hostname: r.simulated for r in rows}
        simulated.update({r.hostname: r.simulated for r in reports})
        yield from gpu_families(rows, ctx.metrics_dcgm_names)
        yield from link_families(links, ctx.metrics_dcgm_names)
        yield from node_families(simulated)
        yield from balance_families(reports)
        if jobs is not None:
            yield from job_metric_families(ctx, jobs)
            yield from guarded("balance", lambda: list(ledger_families(ctx)))  # the GPU-time ledger's counters
        yield from error_families()


def render_metrics(ctx: ApiContext, nvlink_links: Optional[bool] = None) -> bytes:
    """The exposition of ``ctx`` now (serve it with :data:`CONTENT_TYPE`); per-link NVLink series as
    :class:`TrimtabCollector` decides. Blocking (store queries): call it from a sync route, which FastAPI runs in
    its thread pool."""
    return text_exposition(TrimtabCollector(ctx, nvlink_links).collect())
