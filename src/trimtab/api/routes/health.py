"""Operational endpoints: ``/healthz`` for probes and ``/metrics`` for Prometheus (both unauthenticated)."""

from __future__ import annotations

import time
from importlib import metadata

from fastapi import APIRouter, Depends
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from trimtab.api.context import ApiContext
from trimtab.api.deps import get_ctx
from trimtab.api.metrics import render_metrics
from trimtab.api.schemas import HealthOut
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
                        "failed (a component refuses its configuration, e.g. the agent's store or token). Also says the "
                        "version, the mode (up/server), whether any known node is simulated, and the status of the "
                        "agent, writer and rebalancer around the API (components.rebalancer.planner: which server "
                        "plans, as GET /v1/planner says). No authentication.",
            responses={503: {"model": HealthOut, "description": "The store is unreachable, or a component failed."}})
def healthz(ctx: ApiContext = Depends(get_ctx)):
    store = store_health(ctx.engine)
    simulated = any(snap.node.simulated for snap in ctx.snapshot.nodes()) or store.simulated
    reachable = store.reachable
    components = _components(ctx)
    failed = any(isinstance(c, dict) and c.get("state") == "failed" for c in components.values())
    status = "failed" if failed else ("ok" if reachable else "degraded")
    health = HealthOut(status=status, store_reachable=reachable, version=version(),
                       mode=ctx.mode, simulated=simulated, uptime_s=round(time.time() - ctx.started_ms / 1000, 3),
                       components=components)
    return health if status == "ok" else JSONResponse(health.model_dump(mode="json"), status_code=503)


def _components(ctx: ApiContext) -> dict:
    """The daemon's component status as JSON; a failing or odd status callback must not fail the probe."""
    try:
        status = jsonable_encoder(ctx.component_status())
        return status if isinstance(status, dict) else {"status": status}
    except Exception as exc:  # noqa: BLE001 - reported, not raised: this is the health probe
        return {"error": f"component status unavailable: {type(exc).__name__}: {exc}"[:300]}


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
            description="The latest snapshot of every GPU, node and verdict in Prometheus text format 0.0.4 "
                        "(dcgm-exporter names where a DCGM metric exists, trimtab_* otherwise). Rendered per "
                        "scrape from memory: no NVML call.",
            responses={200: {"content": {PROMETHEUS_CONTENT_TYPE: {}}, "description": "Prometheus text format."}})
def prometheus_metrics(ctx: ApiContext = Depends(get_ctx)) -> Response:
    return Response(render_metrics(ctx), media_type=PROMETHEUS_CONTENT_TYPE)
