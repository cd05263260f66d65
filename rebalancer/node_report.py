"""Builds the balance report of each node from the store's window aggregates (used by `trimtab check` and the API).

A node's report grades its GPUs. The job-level checks (step composition, fragmentation, collective latency) are
graded per job (:mod:`trimtab.rebalancer.job_report`); a node's report carries them as "no job data" rows only
while no job reports through the trainer hook, so nobody reads "no job data" next to a job that does report.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Optional

from trimtab.rebalancer.balance import NO_DATA, BalanceReport, assess
from trimtab.rebalancer.grading import job_checks, live_since_ms
from trimtab.rebalancer.rules import RuleSet, default_rules


def any_live_job(engine, window_s: float, now_ms: int) -> bool:
    """Did any job report within ``window_s`` (at least the last 10 minutes)? One indexed query."""
    from trimtab.store.steps import any_report_since

    return any_report_since(engine, live_since_ms(window_s, now_ms))


def node_reports(engine, window_s: float, hostname: Optional[str] = None, now_ms: Optional[int] = None,
                 rules: Optional[RuleSet] = None, live_jobs: Optional[bool] = None) -> list[BalanceReport]:
    """One report per node with samples in the last ``window_s`` seconds (all nodes, or just ``hostname``), graded
    by ``rules`` (default: the shipped rules).

    ``live_jobs``: whether jobs are graded separately (their rows then leave the node reports); None: look it up
    (any job that reported within the window, or the last 10 minutes)."""
    from trimtab.store.queries import gpu_aggregates

    end_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    start_ms = end_ms - int(window_s * 1000)
    by_node: dict[tuple[str, bool], list] = defaultdict(list)
    for agg in gpu_aggregates(engine, start_ms, end_ms, hostname=hostname):
        if agg.n_samples:
            by_node[(agg.hostname, agg.simulated)].append(agg)
    rules = rules or default_rules()
    reports = [assess(host, sim, window_s, aggs, rules) for (host, sim), aggs in sorted(by_node.items())]
    if reports and (live_jobs if live_jobs is not None else any_live_job(engine, window_s, end_ms)):
        rows = set(job_checks(rules))
        for r in reports:
            r.verdicts = [v for v in r.verdicts if not (v.check in rows and v.status == NO_DATA)]
    return reports
