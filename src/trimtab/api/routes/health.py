"""Operational endpoints: ``/healthz`` for probes and ``/metrics`` for Prometheus (both unauthenticated)."""

from __future__ import annotations

import time
from importlib import metadata
from typing import Optional

from fastapi import APIRouter, Depends, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sqlalchemy.exc import SQLAlchemyError

from trimtab.api.context import ApiContext
from trimtab.api.deps import get_ctx
from trimtab.api.metrics import render_metrics
from trimtab.api.schemas import HealthOut, PlanningFailureOut
from trimtab.store.clocks import clocks_in_question
from trimtab.store.queries import store_health

router = APIRouter(tags=["operations"])
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def version() -> str:
    try:
        return metadata.version("trimtab")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@router.get("/healthz", response_model=HealthOut, summary="Liveness and store reachability",
            description="ok when the store answers a trivial query, else 503 with status degraded (an outage) or "
                        "failed (a component refuses its configuration, e.g. the agent's store or token). Degraded "
                        "with 200 while the rebalancer fails to plan a live job (planning_failures names each job "
                        "and its last error; GET /v1/jobs/{name} has more), and when a node's clock is off or its "
                        "batches are refused for it (`clocks` names it: this server works, what it shows of that "
                        "node does not). Also says the version, the mode (up/server), whether any known node is "
                        "simulated, and the status of the agent, writer and rebalancer around the API "
                        "(components.rebalancer.planner: which server plans, as GET /v1/planner says). No "
                        "authentication.",
            responses={503: {"model": HealthOut, "description": "The store is unreachable, or a component failed."}})
def healthz(ctx: ApiContext = Depends(get_ctx)):
    store = store_health(ctx.engine)
    simulated = any(snap.node.simulated for snap in ctx.snapshot.nodes()) or store.simulated
    reachable = store.reachable
    components = _components(ctx)
    failed = any(isinstance(c, dict) and c.get("state") == "failed" for c in components.values())
    planning = _planning_failures(ctx) if reachable else []
    clocks = _clocks(ctx) if reachable else []
    status = "failed" if failed else ("degraded" if not reachable or planning or clocks else "ok")
    health = HealthOut(status=status, store_reachable=reachable, version=version(),
                       mode=ctx.mode, simulated=simulated, uptime_s=round(time.time() - ctx.started_ms / 1000, 3),
                       components=components, planning_failures=planning, clocks=clocks)
    # a job the planner fails on, or a node's wrong clock, degrades what is shown, not this server: still 200
    down = failed or not reachable
    return health if not down else JSONResponse(health.model_dump(mode="json"), status_code=503)


def _planning_failures(ctx: ApiContext) -> list[PlanningFailureOut]:
    """The live jobs whose plans raise now (store/plan_status.py); a store that fails here fails nothing else."""
    from trimtab.grading.grading import LIVE_JOB_S
    from trimtab.store.jobs import get_job
    from trimtab.store.plan_status import describe, failing_jobs

    try:
        out = []
        cutoff = int(time.time() * 1000) - LIVE_JOB_S * 1000
        for name, mode, s in failing_jobs(ctx.engine):
            job = get_job(ctx.engine, name) if mode != "off" else None
            if job is None or job.last_report_ms is None or job.last_report_ms < cutoff:
                continue
            out.append(PlanningFailureOut(job=name, since_ms=s.failing_since_ms, failures=s.failures,
                                          error=describe(s.last_error or {}),
                                          retry_at_ms=s.retry_at_ms))
        return out
    except Exception:  # noqa: BLE001 - the probe answers; the store's own check says whether it is reachable
        return []


def _clocks(ctx: ApiContext) -> list[str]:
    """A line per node whose clock is off or whose batches were refused for it lately (trimtab.store.clocks)."""
    try:
        now_ms = int(time.time() * 1000)
        nodes = clocks_in_question(ctx.engine, now_ms)
    except SQLAlchemyError as exc:
        return [f"node clocks unavailable: {' '.join(str(exc).split())[:200]}"]
    return [f"node {n.hostname}: {n.describe(now_ms)}" for n in nodes]


def _components(ctx: ApiContext) -> dict:
    """The daemon's component status as JSON; a failing or odd status callback must not fail the probe."""
    try:
        status = jsonable_encoder(ctx.component_status())
        return status if isinstance(status, dict) else {"status": status}
    except Exception as exc:  # noqa: BLE001 - reported, not raised: this is the health probe
        return {"error": f"component status unavailable: {type(exc).__name__}: {exc}"[:300]}


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
            description="The latest snapshot of every GPU, node and verdict in Prometheus text format 0.0.4 "
                        "(dcgm-exporter names where a DCGM metric exists, trimtab_* otherwise: by default "
                        "dcgm-exporter 4.10's names, units and `hostname` label, or up to 4.8.2's on a daemon "
                        "started with --metrics-dcgm-names legacy). Rendered per scrape from memory: no NVML call. "
                        "NVLink is per GPU (DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND / RX_BYTES_PER_SECOND, legacy "
                        "DCGM_FI_PROF_NVLINK_TX_BYTES / RX_BYTES, summed over its links), as dcgm-exporter's "
                        "default collectors export it; the "
                        "per-link series (trimtab_gpu_nvlink_link_*, label `link`) come only with "
                        "`nvlink_links=true` or on a daemon started with --metrics-nvlink-links "
                        "(TRIMTAB_METRICS_NVLINK_LINKS=1).",
            responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}, "description": "Prometheus text format."}})
def prometheus_metrics(ctx: ApiContext = Depends(get_ctx), nvlink_links: Optional[bool] = Query(
        None, description="Per-link NVLink series (trimtab_gpu_nvlink_link_*): true adds them, false leaves them "
                          "out; absent: as the daemon's --metrics-nvlink-links says (off by default). Prometheus "
                          "sends it from a scrape config's `params: {nvlink_links: [\"true\"]}`.")) -> Response:
    return Response(render_metrics(ctx, nvlink_links), media_type=PROMETHEUS_CONTENT_TYPE)
