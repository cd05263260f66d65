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

from trimtab.contract.readings import GPU_METRIC_NAMES, MAX_CLOCK_AHEAD_S, NVLINK_LINK_METRIC_NAMES
from trimtab.api.live_view import LatestSnapshot
from trimtab.grading.rules import RuleSet, default_rules
from trimtab.store.jobs import StoredJob
from trimtab.store.queries import LatestLink, LatestSample, latest_gpu_samples, latest_nvlink_samples


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
    # Called with the job, the step and its step time after each newly stored step report, once per stored batch
    # (its newest new report; its other new ones as ``earlier=[(step, step_time_s), …]``): the rebalancer's
    # evaluation (None: no rebalancer).
    after_report: Optional[Callable[..., None]] = None
    after_refusal: Optional[Callable[[StoredJob], None]] = None
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    # Which server plans and whether this one does (control/leadership.py; None: this process takes no part).
    planner_status: Optional[Callable[[], dict[str, Any]]] = None
    # Per-link NVLink series on /metrics by default (``--metrics-nvlink-links``; a scrape's ?nvlink_links= wins):
    # off, as dcgm-exporter's default collectors, because they are ~70 % of a scrape's lines (18 links x 3 families).
    metrics_nvlink_links: bool = False
    # Which dcgm-exporter generation /metrics names its DCGM series after (``--metrics-dcgm-names``): "current"
    # (4.10's names and units, label ``hostname``) or "legacy" (up to 4.8.2's, label ``Hostname`` too).
    metrics_dcgm_names: str = "current"

    def latest_gpus(self, max_age_s: float = 300.0) -> list[LatestSample]:
        """The newest sample of every GPU: from memory (fed by the local agent and by ingest), and from the store
        for GPUs whose agents write to it directly. Samples older than ``max_age_s`` are left out (a stopped node
        must not look alive), and so are samples more than MAX_CLOCK_AHEAD_S in the future (a node with a wrong clock, or
        a store an agent wrote to directly, must not pin a GPU's live view to one bogus reading)."""
        now_ms = int(time.time() * 1000)
        out: dict[str, LatestSample] = {}
        for snap in self.snapshot.nodes():
            for uuid, s in snap.samples.items():
                g = snap.gpus.get(uuid)
                if g is None or not _live(s.ts_ms, now_ms, max_age_s):
                    continue
                out[uuid] = LatestSample(
                    hostname=snap.node.hostname, simulated=snap.node.simulated, gpu_uuid=uuid, gpu_index=g.index,
                    gpu_name=g.name, pcie_peak_bytes_per_s=g.pcie_peak_bytes_per_s, nvlink_link_count=g.nvlink_link_count,
                    ts_ms=s.ts_ms, metrics={m: getattr(s, m) for m in GPU_METRIC_NAMES})
        if self.mode == "server":
            for row in latest_gpu_samples(self.engine, not_after_ms=now_ms + MAX_CLOCK_AHEAD_S * 1000):
                if row.gpu_uuid not in out and _live(row.ts_ms, now_ms, max_age_s):
                    out[row.gpu_uuid] = row
        return sorted(out.values(), key=lambda r: (r.hostname, r.gpu_index))

    def latest_links(self, max_age_s: float = 300.0) -> list[LatestLink]:
        """The newest per-link NVLink reading of every link, as :meth:`latest_gpus` finds GPU samples (memory,
        then the store on a server; the same age limits). GPUs without NVLink have none."""
        now_ms = int(time.time() * 1000)
        out: dict[tuple[str, int], LatestLink] = {}
        for snap in self.snapshot.nodes():
            for (uuid, link), n in snap.links.items():
                g = snap.gpus.get(uuid)
                if g is None or not _live(n.ts_ms, now_ms, max_age_s):
                    continue
                out[(uuid, link)] = LatestLink(
                    hostname=snap.node.hostname, simulated=snap.node.simulated, gpu_uuid=uuid, gpu_index=g.index,
                    gpu_name=g.name, pcie_peak_bytes_per_s=g.pcie_peak_bytes_per_s,
                    nvlink_link_count=g.nvlink_link_count, ts_ms=n.ts_ms, link=link,
                    metrics={m: getattr(n, m) for m in NVLINK_LINK_METRIC_NAMES})
        if self.mode == "server":
            in_memory = {uuid for uuid, _ in out}
            for row in latest_nvlink_samples(self.engine, not_after_ms=now_ms + MAX_CLOCK_AHEAD_S * 1000):
                if row.gpu_uuid not in in_memory and _live(row.ts_ms, now_ms, max_age_s):
                    out[(row.gpu_uuid, row.link)] = row
        return sorted(out.values(), key=lambda r: (r.hostname, r.gpu_index, r.link))


def _live(ts_ms: int, now_ms: int, max_age_s: float) -> bool:
    return -MAX_CLOCK_AHEAD_S * 1000 <= now_ms - ts_ms <= max_age_s * 1000


__all__ = ["ApiContext"]
