"""The latest reading of every GPU and host, kept in memory for scrapes and status lines.

Fed with every batch the local agent produces (`trimtab up`) or the server ingests (`trimtab server`), so
`/metrics` renders the newest numbers without touching NVML or the store.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from trimtab.contract.readings import MAX_CLOCK_AHEAD_S, Batch, GpuInfo, GpuSample, HostSample, NodeInfo, NvlinkSample


@dataclass
class NodeSnapshot:
    node: NodeInfo
    gpus: dict[str, GpuInfo] = field(default_factory=dict)  # by uuid
    samples: dict[str, GpuSample] = field(default_factory=dict)  # latest per GPU uuid
    links: dict[tuple[str, int], NvlinkSample] = field(default_factory=dict)  # latest per (GPU uuid, link)
    host: Optional[HostSample] = None
    received_ms: int = 0


# A node (or one GPU or link of it) silent this long leaves the live view: readers show nothing older than 300 s,
# and a fleet whose host names come and go (pods) must not keep one entry per name ever seen (issue 39).
FORGET_AFTER_S = 900.0
SWEEP_EVERY_S = 60.0  # how often an update looks for what to forget


class LatestSnapshot:
    """The live view; holds the nodes heard from within ``forget_after_s``, and of each the samples of GPUs and
    links that reported within it, so its size is the live fleet's, not the history's."""

    def __init__(self, forget_after_s: float = FORGET_AFTER_S) -> None:
        if not forget_after_s > 0:
            raise ValueError(f"forget_after_s must be > 0, not {forget_after_s!r}")
        self.forget_after_ms = int(forget_after_s * 1000)
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeSnapshot] = {}
        self._next_sweep_ms = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def update(self, batch: Batch) -> None:
        with self._lock:
            self._maybe_forget(int(time.time() * 1000))
            snap = self._nodes.get(batch.node.hostname)
            if snap is None or snap.node != batch.node:
                old = snap
                snap = NodeSnapshot(node=batch.node)
                if old is not None:
                    snap.samples, snap.host, snap.gpus, snap.links = old.samples, old.host, old.gpus, old.links
                self._nodes[batch.node.hostname] = snap
            for g in batch.gpus:
                snap.gpus[g.uuid] = g
            future_ms = int(time.time() * 1000) + MAX_CLOCK_AHEAD_S * 1000
            for s in batch.gpu_samples:
                prev = snap.samples.get(s.gpu_uuid)
                # Newest wins, except that a reading dated in the far future never holds the place of real ones.
                if prev is None or s.ts_ms >= prev.ts_ms or prev.ts_ms > future_ms:
                    snap.samples[s.gpu_uuid] = s
            for n in batch.nvlink_samples:
                key = (n.gpu_uuid, n.link)
                prev_link = snap.links.get(key)
                if prev_link is None or n.ts_ms >= prev_link.ts_ms or prev_link.ts_ms > future_ms:
                    snap.links[key] = n
            for h in batch.host_samples:
                if snap.host is None or h.ts_ms >= snap.host.ts_ms:
                    snap.host = h
            snap.received_ms = int(time.time() * 1000)

    def _maybe_forget(self, now_ms: int) -> None:
        """Drop what has been silent past ``forget_after_ms`` (by arrival for nodes, by sample time for GPUs and
        links); at most once every SWEEP_EVERY_S. Called under the lock."""
        if now_ms < self._next_sweep_ms:
            return
        self._next_sweep_ms = now_ms + int(SWEEP_EVERY_S * 1000)
        since_ms = now_ms - self.forget_after_ms
        for hostname in [h for h, snap in self._nodes.items() if snap.received_ms < since_ms]:
            del self._nodes[hostname]
        for snap in self._nodes.values():
            for uuid in [u for u, s in snap.samples.items() if s.ts_ms < since_ms]:
                del snap.samples[uuid]  # its facts (snap.gpus) stay: bounded by the node's GPUs, sent once
            for key in [k for k, n in snap.links.items() if n.ts_ms < since_ms]:
                del snap.links[key]

    def nodes(self) -> list[NodeSnapshot]:
        """A consistent copy (safe to read while agents keep updating)."""
        with self._lock:
            return [NodeSnapshot(node=s.node, gpus=dict(s.gpus), samples=dict(s.samples), links=dict(s.links),
                                 host=s.host, received_ms=s.received_ms) for s in self._nodes.values()]
