"""The latest reading of every GPU and host, kept in memory for scrapes and status lines.

Fed with every batch the local agent produces (`trimtab up`) or the server ingests (`trimtab server`), so
`/metrics` renders the newest numbers without touching NVML or the store. The newest is the newest by its stamp, or
after the node's clock stepped back the newest on this process's clock (the stamp + the node's skew as its batch
came, STEP_BACK_MARGIN_MS past the held one): as the store's latest rows (:mod:`trimtab.store.ingest`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Hashable, Optional

from trimtab.contract.readings import MAX_CLOCK_AHEAD_S, STEP_BACK_MARGIN_MS, Batch, GpuInfo, GpuSample, HostSample, \
    NodeInfo, NvlinkSample


@dataclass
class NodeSnapshot:
    node: NodeInfo
    gpus: dict[str, GpuInfo] = field(default_factory=dict)  # by uuid
    samples: dict[str, GpuSample] = field(default_factory=dict)  # latest per GPU uuid
    links: dict[tuple[str, int], NvlinkSample] = field(default_factory=dict)  # latest per (GPU uuid, link)
    host: Optional[HostSample] = None
    received_ms: int = 0
    # What each held reading's stamp is on the view's clock (key: GPU uuid, (uuid, link), or HOST; None: not known).
    receiver_ms: dict[Hashable, Optional[int]] = field(default_factory=dict)


HOST = "host"  # the host reading's key in NodeSnapshot.receiver_ms


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
        # The view's own clock for ordering: the wall clock at start carried on the monotonic clock, so a step of
        # this machine's wall clock (`trimtab up`: the node's own) shows as the node's skew changing.
        self._wall_minus_monotonic_ms = time.time_ns() // 1_000_000 - time.monotonic_ns() // 1_000_000

    def __len__(self) -> int:
        return len(self._nodes)

    def update(self, batch: Batch, sent_ms: Optional[int] = None) -> None:
        """Take ``batch``'s readings where they are newer than the held ones. ``sent_ms``: the node's wall clock
        as it sent the batch (`trimtab up`: as it sampled it), so a node whose clock stepped back is followed
        (None: stamps alone decide)."""
        with self._lock:
            self._maybe_forget(int(time.time() * 1000))
            snap = self._nodes.get(batch.node.hostname)
            if snap is None or snap.node != batch.node:
                old = snap
                snap = NodeSnapshot(node=batch.node)
                if old is not None:
                    snap.samples, snap.host, snap.gpus, snap.links = old.samples, old.host, old.gpus, old.links
                    snap.receiver_ms = old.receiver_ms
                self._nodes[batch.node.hostname] = snap
            for g in batch.gpus:
                snap.gpus[g.uuid] = g
            now_ms = time.monotonic_ns() // 1_000_000 + self._wall_minus_monotonic_ms
            newer = _Newer(snap, now_ms, None if sent_ms is None else now_ms - sent_ms,
                           int(time.time() * 1000) + MAX_CLOCK_AHEAD_S * 1000)
            for s in batch.gpu_samples:
                if newer(s.gpu_uuid, s.ts_ms, snap.samples.get(s.gpu_uuid)):
                    snap.samples[s.gpu_uuid] = s
            for n in batch.nvlink_samples:
                key = (n.gpu_uuid, n.link)
                if newer(key, n.ts_ms, snap.links.get(key)):
                    snap.links[key] = n
            for h in batch.host_samples:
                if newer(HOST, h.ts_ms, snap.host):
                    snap.host = h
            snap.received_ms = int(time.time() * 1000)

    def update_sampled(self, batch: Batch) -> None:
        """:meth:`update` with a batch sampled just now on this machine (`trimtab up`'s own agent)."""
        self.update(batch, time.time_ns() // 1_000_000)

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
                snap.receiver_ms.pop(uuid, None)
            for key in [k for k, n in snap.links.items() if n.ts_ms < since_ms]:
                del snap.links[key]
                snap.receiver_ms.pop(key, None)

    def nodes(self) -> list[NodeSnapshot]:
        """A consistent copy (safe to read while agents keep updating)."""
        with self._lock:
            return [NodeSnapshot(node=s.node, gpus=dict(s.gpus), samples=dict(s.samples), links=dict(s.links),
                                 host=s.host, received_ms=s.received_ms) for s in self._nodes.values()]


class _Newer:
    """Whether a reading replaces the held one of its key, noting its time on the view's clock when it does: newer
    by its stamp; or the held one dated in the far future (one bogus reading must not hold the place of real ones);
    or newer on the view's clock by STEP_BACK_MARGIN_MS (the node's clock stepped back). That time is the stamp +
    the node's skew, at most now (a batch kept from before a step, sent after it, claims no time to come)."""

    def __init__(self, snap: NodeSnapshot, now_ms: int, skew_ms: Optional[int], future_ms: int):
        self._snap, self._now_ms, self._skew_ms, self._future_ms = snap, now_ms, skew_ms, future_ms

    def __call__(self, key: Hashable, ts_ms: int, held) -> bool:
        mine = None if self._skew_ms is None else min(ts_ms + self._skew_ms, self._now_ms)
        theirs = None if held is None else self._snap.receiver_ms.get(key)
        if (held is None or ts_ms >= held.ts_ms or held.ts_ms > self._future_ms
                or (mine is not None and theirs is not None and mine > theirs + STEP_BACK_MARGIN_MS)):
            self._snap.receiver_ms[key] = mine
            return True
        return False
