"""What the API needs from the daemon around it, in one object handed to ``create_app``.

Keeping this explicit (rather than module globals) lets `trimtab up` (agent + API in one process) and
`trimtab server` (API for many remote agents) build the same app with different parts, and lets tests build an
app around a throw-away store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from sqlalchemy.engine import Engine

from trimtab.agent.readings import GPU_METRIC_NAMES
from trimtab.agent.snapshot import LatestSnapshot
from trimtab.rebalancer.rules import RuleSet, default_rules
from trimtab.store.jobs import StoredJob
from trimtab.store.queries import LatestSample, latest_gpu_samples


@dataclass
class ApiContext:
    engine: Engine
    mode: str  # "up" (one node, agent in process) or "server" (head node for remote agents)
    state_dir: Path
    snapshot: LatestSnapshot = field(default_factory=LatestSnapshot)
    max_body_bytes: int = 8 * 1024 * 1024
    max_batch_rows: int = 100_000
    # BatchWriters shared by ingest requests; 0: one on SQLite (one writer at a time anyway), four on PostgreSQL.
    ingest_writers: int = 0
    # Status of the parts around the API (agent, writer, rebalancer), for /healthz and the systemd STATUS line.
    component_status: Callable[[], dict[str, Any]] = lambda: {}
    # The rules jobs are judged by (per-job overrides are checked against them at registration).
    rules: RuleSet = field(default_factory=default_rules)
    # Called with the job and the step after each newly stored step report: the rebalancer's evaluation (None: no
    # rebalancer).
    after_report: Optional[Callable[[StoredJob, int], None]] = None
    after_refusal: Optional[Callable[[StoredJob], None]] = None
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def latest_gpus(self, max_age_s: float = 300.0) -> list[LatestSample]:
        """The newest sample of every GPU: from memory (fed by the local agent and by ingest), and from the store
        for GPUs whose agents write to it directly. Samples older than ``max_age_s`` are left out (a stopped node
        must not look alive)."""
        now_ms = int(time.time() * 1000)
        out: dict[str, LatestSample] = {}
        for snap in self.snapshot.nodes():
            for uuid, s in snap.samples.items():
                g = snap.gpus.get(uuid)
                if g is None or now_ms - s.ts_ms > max_age_s * 1000:
                    continue
                out[uuid] = LatestSample(
                    hostname=snap.node.hostname, simulated=snap.node.simulated, gpu_uuid=uuid, gpu_index=g.index,
                    gpu_name=g.name, pcie_peak_bytes_per_s=g.pcie_peak_bytes_per_s, nvlink_link_count=g.nvlink_link_count,
                    ts_ms=s.ts_ms, metrics={m: getattr(s, m) for m in GPU_METRIC_NAMES})
        if self.mode == "server":
            for row in latest_gpu_samples(self.engine):
                if row.gpu_uuid not in out and now_ms - row.ts_ms <= max_age_s * 1000:
                    out[row.gpu_uuid] = row
        return sorted(out.values(), key=lambda r: (r.hostname, r.gpu_index))


__all__ = ["ApiContext"]
