"""The balance verdict of every node (``trimtab check``'s data), graded over a recent window."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Depends, Query

from trimtab.api.context import ApiContext
from trimtab.api.deps import READ, get_ctx
from trimtab.api.routes.gpus import node_query
from trimtab.api.schemas import BalanceOut, BalanceReportOut
from trimtab.rebalancer.balance import SEVERITY
from trimtab.rebalancer.node_report import node_reports

router = APIRouter(prefix="/v1", tags=["telemetry"])


@router.get("/balance", response_model=BalanceOut, responses=READ, summary="Balance verdict per node",
            description="For every node with samples in the last window_s seconds (or one node): per-GPU window "
                        "means and one verdict per check (utilization spread, PCIe % of peak, memory, and the "
                        "job-level checks), graded against the thresholds (ok / watch / act). The overall status is "
                        "the worst; no_data when no node has samples in the window.")
def balance(window_s: float = Query(30.0, ge=1, le=90 * 86400, description="Grade the means of the last "
                                                                            "window_s seconds."),
            node: Optional[str] = node_query(), ctx: ApiContext = Depends(get_ctx)) -> BalanceOut:
    reports = node_reports(ctx.engine, window_s, hostname=node)
    status = max((r.status for r in reports), key=SEVERITY.__getitem__) if reports else "no_data"
    return BalanceOut(status=status, simulated=any(r.simulated for r in reports), window_s=window_s,
                      reports=[BalanceReportOut.model_validate(r.to_dict()) for r in reports])
