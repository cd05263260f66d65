"""Scrapes that left out a part's series because reading it failed: one long-lived counter for the life of the
process (a counter must not reset per scrape), and a warning once per outage of a part, not once per scrape."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterator

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, Metric

log = logging.getLogger(__name__)

PARTS = ("gpus", "balance")
NAME = "trimtab_scrape_errors"
HELP = ("Scrapes of /metrics that left out a part's series because reading it failed (part: gpus = the latest GPU "
        "samples, balance = what comes from the store: node verdicts, jobs, rebalancer decisions and the GPU-time "
        "ledger's counters).")

# In no registry: the collector renders it (without the `_created` series a registered Counter would add).
SCRAPE_ERRORS = Counter(NAME, HELP, ["part"], registry=None)
for _part in PARTS:
    SCRAPE_ERRORS.labels(_part)  # every part shows, at 0 until it fails

_failing: set[str] = set()
_failing_lock = threading.Lock()


def guarded(part: str, read: Callable[[], list]) -> list:
    """``read()``, or [] when it fails: a store error drops this part's series, not the whole scrape."""
    try:
        result = read()
    except Exception as exc:  # noqa: BLE001 - whatever the store raises, the scrape must still answer
        SCRAPE_ERRORS.labels(part).inc()
        with _failing_lock:
            first = part not in _failing
            _failing.add(part)
        if first:
            log.warning("/metrics: %s series left out: %s", part, " ".join(str(exc).split())[:300])
        return []
    with _failing_lock:
        back = part in _failing
        _failing.discard(part)
    if back:
        log.info("/metrics: %s series are back", part)
    return result


def error_families() -> Iterator[Metric]:
    family = CounterMetricFamily(NAME, HELP, labels=["part"])
    for metric in SCRAPE_ERRORS.collect():
        for sample in metric.samples:
            if sample.name == f"{NAME}_total":
                family.add_metric([sample.labels["part"]], sample.value)
    yield family
