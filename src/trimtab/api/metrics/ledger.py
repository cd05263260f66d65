"""The GPU-time ledger as counters: ``trimtab_job_gpu_seconds_total{job,role,phase,gpu,hostname}`` (busy) and
``trimtab_gpu_idle_seconds_total{job,gpu,cause,hostname}`` (idle; a wait's cause is ``waiting_for_<role>``).

Counters, so they read the accumulated ledger (trimtab.grading.ledger.read.advance_ledgers), which the server's
ledger ticker (trimtab.grading.ledger.ticker) advances every 15 s by the time since its last advance: a sliding
window would go down as time leaves it. A scrape only reads that table (one statement); it neither computes nor
advances anything, so its cost does not depend on how long since the last scrape."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import Metric

from trimtab.api.context import ApiContext
from trimtab.api.metrics.families import Row, counter
from trimtab.grading.ledger.model import BUSY, cause_label
from trimtab.store import jobs as job_store
from trimtab.store import ledger as ledger_store


def ledger_families(ctx: ApiContext) -> Iterator[Metric]:
    """The accumulated ledgers as the ledger ticker last advanced them (read only)."""
    engine = ctx.engine
    simulated = job_store.simulated_hostnames(engine)
    busy: list[Row] = []
    idle: dict[tuple[str, str, str, str], float] = {}
    for r in ledger_store.accumulated(engine):
        if r.kind == BUSY:
            busy.append(Row({"job": r.job, "role": r.role, "phase": r.name, "gpu": str(r.gpu_index),
                             "hostname": r.hostname}, r.hostname in simulated, r.gpu_s))
        else:
            key = (r.job, str(r.gpu_index), cause_label(r.name, r.waiting_for), r.hostname)
            idle[key] = idle.get(key, 0.0) + r.gpu_s
    yield from counter("trimtab_job_gpu_seconds", "GPU-seconds a job's GPU was busy in a role's phase (CUDA-event "
                       "phase times, else wall times), accumulated since the ledger first saw the job, up to the "
                       "server's last ledger tick (every 15 s; 10 s behind now at least). Unit: seconds.", busy)
    yield from counter("trimtab_gpu_idle_seconds", "GPU-seconds a job's GPU idled, by cause: waiting_for_<role> "
                       "(the role whose GPUs worked meanwhile), host (host-side work of its own role), "
                       "communication (collectives, weight sync), no_job (no step of the job on it), unknown; "
                       "accumulated since the ledger first saw the job, up to the server's last ledger tick. "
                       "Unit: seconds.",
                       [Row({"job": j, "gpu": g, "cause": c, "hostname": h}, h in simulated, v)
                        for (j, g, c, h), v in sorted(idle.items())])
