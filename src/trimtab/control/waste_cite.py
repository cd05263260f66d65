"""A rebalancer decision's evidence cites the GPU-time ledger (trimtab.grading.ledger): the largest waste over the
job's last ``WINDOW_S`` seconds that the decided action addresses — its GPU-hours, cause, roles and GPUs — so
/v1/decisions and `trimtab check` say what the move is for in GPU-hours.

A knob change addresses the wastes whose playbook action moves that knob (trimtab.grading.ledger.wastes.ACTIONS:
batch size and prefetch for waits on the actor, sync_every for communication, …); advice that names no knob cites
the largest waste and says it was matched by size only. Where the ledger has no waste the knob addresses, the
evidence says so and names the largest one instead. Reading the ledger never stops a decision: a failed read is a
note in the evidence."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from sqlalchemy import Engine

from trimtab.store.jobs import StoredJob

WINDOW_S = 600.0  # as check's GPU-time section


def with_waste(engine: Engine, job: StoredJob, evidence: Mapping[str, Any], knob: Optional[str],
               now_ms: int) -> dict[str, Any]:
    """``evidence`` with ``gpu_time_waste``: the largest waste ``knob`` addresses (knob None: the largest)."""
    from trimtab.grading.ledger.read import job_ledger
    from trimtab.grading.ledger.wastes import addressed_by, largest_wastes

    try:
        ledger = job_ledger(engine, job, now_ms - int(WINDOW_S * 1000), now_ms)
    except Exception as exc:  # noqa: BLE001 — the decision stands without it; the evidence says why it is missing
        return {**evidence, "gpu_time_waste": {"unknown": f"the ledger could not be read: {type(exc).__name__}: "
                                                          f"{exc}"[:300]}}
    wastes = largest_wastes([(f"{h}:{g}", k, r, n, w, v) for (h, g, k, r, n, w), v in ledger.totals().items()],
                            n=None)
    if not wastes:
        return {**evidence, "gpu_time_waste": {"window_s": WINDOW_S, "none": "no idle GPU time in the ledger"}}
    hit = addressed_by(wastes, knob) if knob else wastes[:1]
    cited = {"window_s": WINDOW_S, **(hit[0] if hit else wastes[0]).to_dict(),
             "matched": ("the action moves " + knob) if knob and hit else
             "by size (advice names no knob)" if not knob else
             f"none of the ledger's wastes is addressed by {knob}: the largest is named"}
    return {**evidence, "gpu_time_waste": cited}
