"""Wires an agent together: sources → sampler → writer (→ spool) → sink, with a readable status line.

Used by `trimtab agent`, `trimtab check --live` and `trimtab up`, so all three sample the same way.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

from trimtab.contract.readings import Batch
from trimtab.agent.sampler import Sampler
from trimtab.contract.sink import Sink
from trimtab.agent.source import Source, SourceUnavailable
from trimtab.agent.spool import Spool
from trimtab.agent.writer import Writer

log = logging.getLogger(__name__)


def make_sources(
    simulate: Optional[int] = None,
    scenario: str = "balanced",
    seed: int = 0,
    gpu_indices: Optional[Sequence[int]] = None,
    fallback_gpus: Optional[int] = None,
    hostname: Optional[str] = None,
) -> list[Source]:
    """NVML + host on a GPU node; a simulated node + host with ``simulate``. With ``fallback_gpus`` a machine
    without a driver falls back to a simulated node of that many GPUs (what `trimtab up` does) and says so.
    ``hostname`` names a simulated node, so two simulated nodes on one machine have distinct GPU UUIDs."""
    from trimtab.agent.host import HostSource
    from trimtab.agent.simulated import SimulatedNode

    if simulate:
        return [SimulatedNode(simulate, scenario=scenario, seed=seed, hostname=hostname), HostSource()]
    from trimtab.agent.nvml import NO_DRIVER_HINT, NvmlSource

    try:
        return [NvmlSource(indices=gpu_indices), HostSource()]
    except SourceUnavailable as exc:
        if not fallback_gpus:
            raise
        # The hint ("run `trimtab agent --simulate N`") is what this fallback already does: leave it out.
        why = str(exc).replace(NO_DRIVER_HINT, "").strip().rstrip(".")
        log.warning("%s — starting a SIMULATED node of %d GPUs (scenario %s) instead", why, fallback_gpus, scenario)
        return [SimulatedNode(fallback_gpus, scenario=scenario, seed=seed, hostname=hostname), HostSource()]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Agent:
    """One node's sampling pipeline. ``run`` blocks until stopped, then flushes (queued batches are written,
    or spooled if the sink is down)."""

    def __init__(
        self,
        sources: Sequence[Source],
        sink: Sink,
        spool_dir: Path,
        *,
        interval_s: float = 1.0,
        hostname: Optional[str] = None,
        status_every_s: float = 10.0,
        spool_max_bytes: int = 256 * 1024 * 1024,
        on_batch: Optional[Callable[[Batch], None]] = None,
    ):
        self.sources = list(sources)
        self.sink = sink
        self.spool = Spool(spool_dir, max_bytes=spool_max_bytes)
        self.writer = Writer(sink, self.spool)
        self._extra_on_batch = on_batch
        self.sampler = Sampler(self.sources, self._on_batch, interval_s=interval_s, hostname=hostname,
                               status_every_s=status_every_s, status_line=lambda s: self.status_line())

    def _on_batch(self, batch: Batch) -> None:
        self.writer.submit(batch)
        if self._extra_on_batch is not None:
            self._extra_on_batch(batch)

    @property
    def node(self):
        return self.sampler.node

    def banner(self) -> str:
        node = self.node
        kind = f"SIMULATED node (scenario {node.scenario})" if node.simulated else f"driver {node.driver_version}"
        return (f"trimtab agent on {node.hostname}: {len(self.sampler.gpus)} GPUs, {kind}, every "
                f"{self.sampler.interval_s:g} s into {self.sink.description}; spool {self.spool.directory}")

    def status_line(self) -> str:
        st, ws = self.sampler.stats, self.writer.status
        sim = " [SIMULATED]" if self.node.simulated else ""
        store = ("ok" if ws.sink_ok else f"DOWN ({ws.last_error})") if ws.failed is None else f"FAILED ({ws.failed})"
        util = "-"
        if st.last_batch is not None and st.last_batch.gpu_samples:
            util = " ".join("-" if s.util_pct is None else f"{s.util_pct:.0f}" for s in st.last_batch.gpu_samples) + " %"
        dropped = f", DROPPED {ws.rows_dropped} rows" if ws.rows_dropped else ""
        return (f"{self.node.hostname}{sim}: {st.ticks} ticks ({st.ticks_skipped} skipped, last {st.last_tick_cost_s * 1e3:.1f} ms)"
                f" | store {store}: {ws.rows_written} rows written, spool {_fmt_bytes(ws.spool_bytes)}{dropped}"
                f" | util {util}")

    def health(self) -> dict:
        """The agent's state for /healthz: ticks, the store's reachability, spool and drops."""
        st, ws = self.sampler.stats, self.writer.status
        state = "failed" if ws.failed is not None else ("ok" if ws.sink_ok else "store_down")
        return {"state": state, "failed": ws.failed,
                "hostname": self.node.hostname, "simulated": self.node.simulated, "gpus": len(self.sampler.gpus),
                "ticks": st.ticks, "ticks_skipped": st.ticks_skipped, "last_tick_cost_s": st.last_tick_cost_s,
                "store_ok": ws.sink_ok, "rows_written": ws.rows_written, "spool_bytes": ws.spool_bytes,
                "rows_dropped": ws.rows_dropped, "batches_rejected": ws.batches_rejected, "last_error": ws.last_error}

    @property
    def failed(self) -> Optional[str]:
        """Why the sink refuses this agent as configured (then ``run`` has stopped), or None."""
        return self.writer.status.failed

    def run(self, stop: threading.Event, duration_s: Optional[float] = None,
            on_tick: Optional[Callable[[], None]] = None) -> None:
        """Sample until stopped, ``duration_s`` passed, or the sink refuses this configuration (:attr:`failed`)."""
        self.writer.start()

        def tick() -> None:
            if on_tick is not None:
                on_tick()
            if self.writer.status.failed is not None:  # the store refuses us: sampling on would only fill the spool
                stop.set()

        try:
            self.sampler.run(stop, duration_s=duration_s, on_tick=tick)
        finally:
            self.writer.stop()
            for src in self.sources:
                try:
                    src.close()
                except Exception as exc:  # closing must not hide the real exit reason
                    log.warning("closing source %s: %s", src.kind, exc)
            log.info("stopped: %s", self.status_line())


__all__ = ["Agent", "make_sources", "SourceUnavailable"]
