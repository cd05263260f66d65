#!/usr/bin/env python3
"""Writes trimtab's Grafana dashboards (``grafana/dashboards/*.json``) from the definitions in
:mod:`grafana.node_boards` and :mod:`grafana.job_boards` (built from :mod:`grafana.panels`).

The JSON files are what Grafana provisions and what the tests read; this module is how they are made, so that
the SQL of every GPU panel shares one time filter, one resolution switch and one GPU label, and the threshold bands
are written once. Edit those, then run::

    python3 -m grafana.generate          # rewrite the JSON files (from the checkout's root)
    python3 -m grafana.generate --check  # exit 1 if a JSON file differs from what this module writes

Conventions (grafana/README.md explains them for readers of the dashboards):

* Store times are epoch milliseconds. Filters use Grafana's global ``$__from`` / ``$__to`` (epoch ms), so the
  ``ts_ms`` indexes are used; buckets use ``$__unixEpochGroupAlias(<ms> / 1000.0, $__interval)``.
* GPU panels pick their table by the width of the time range, as the API's ``resolution=auto`` does: raw samples
  up to 2 h, 1-minute rollups up to 72 h, 1-hour rollups beyond. Means of rollup buckets are weighted by their
  sample count.
* A metric a GPU does not support is NULL in the store and absent in Prometheus. Time series leave such a GPU out
  (no flat zero line) and say "unsupported" when nothing is left; tables map NULL to "unsupported".
* Job panels fold the ranks' reports into steps as the rebalancer does (``trimtab.grading.window``): a step
  lasts as long as its slowest rank, each phase takes the slowest rank's time, samples add up.
"""

from __future__ import annotations

import json
import sys

from grafana.job_boards import job_pg, rebalancer_pg
from grafana.node_boards import (balance_pg, balance_prom, interconnect_pg, interconnect_prom, memory_pg,
                                 memory_prom)
from grafana.panels import DASHBOARD_DIR

DASHBOARDS = {
    "balance.json": balance_pg, "balance-prometheus.json": balance_prom,
    "interconnect.json": interconnect_pg, "interconnect-prometheus.json": interconnect_prom,
    "memory.json": memory_pg, "memory-prometheus.json": memory_prom,
    "job.json": job_pg, "rebalancer.json": rebalancer_pg,
}


def render(build) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    DASHBOARD_DIR.mkdir(exist_ok=True)
    for name, build in DASHBOARDS.items():
        path, text = DASHBOARD_DIR / name, render(build)
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("stale (run python3 -m grafana.generate):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
