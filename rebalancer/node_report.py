"""Builds the balance report of each node from the store's window aggregates (used by `trimtab check` and the API)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Mapping, Optional

from trimtab.rebalancer.balance import BalanceReport, assess


def node_reports(engine, window_s: float, hostname: Optional[str] = None, now_ms: Optional[int] = None,
                 thresholds: Optional[Mapping[str, Mapping[str, Any]]] = None) -> list[BalanceReport]:
    """One report per node with samples in the last ``window_s`` seconds (all nodes, or just ``hostname``)."""
    from trimtab.store.queries import gpu_aggregates

    end_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    start_ms = end_ms - int(window_s * 1000)
    by_node: dict[tuple[str, bool], list] = defaultdict(list)
    for agg in gpu_aggregates(engine, start_ms, end_ms, hostname=hostname):
        if agg.n_samples:
            by_node[(agg.hostname, agg.simulated)].append(agg)
    return [assess(host, sim, window_s, aggs, thresholds) for (host, sim), aggs in sorted(by_node.items())]
