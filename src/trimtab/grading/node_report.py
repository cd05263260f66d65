"""Builds the balance report of each node from the store's window aggregates (used by `trimtab check` and the API).

A node's report grades its GPUs. The job-level checks (step composition, fragmentation, collective latency) are
graded per job (:mod:`trimtab.grading.job_report`); a node's report carries them as "no job data" rows only
while no job reports through the trainer hook, so nobody reads "no job data" next to a job that does report.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Optional

from trimtab.contract.statuses import NO_DATA
from trimtab.grading.balance import BalanceReport, assess
from trimtab.grading.grading import job_checks, live_since_ms
from trimtab.grading.rules import RuleSet, default_rules


def any_live_job(engine, window_s: float, now_ms: int) -> bool:
    """Did any job report within ``window_s`` (at least the last 10 minutes)? One indexed query."""
    from trimtab.store.steps import any_report_since

    return any_report_since(engine, live_since_ms(window_s, now_ms))


def node_reports(engine, window_s: float, hostname: Optional[str] = None, now_ms: Optional[int] = None,
                 rules: Optional[RuleSet] = None, live_jobs: Optional[bool] = None,
                 freshness: bool = True) -> list[BalanceReport]:
    """One report per node with samples in the last ``window_s`` seconds (all nodes, or just ``hostname``), graded
    by ``rules`` (default: the shipped rules).

    ``live_jobs``: whether jobs are graded separately (their rows then leave the node reports); None: look it up
    (any job that reported within the window, or the last 10 minutes). ``freshness``: judge whether each node's
    samples are stale (:func:`_judge_freshness`; a node with one sample in the window costs one more query), and
    list each node heard from lately with no sample in the window (its clock: :func:`_with_clocks`)."""
    from trimtab.store.queries import gpu_aggregates

    end_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    start_ms = end_ms - int(window_s * 1000)
    by_node: dict[tuple[str, bool], list] = defaultdict(list)
    for agg in gpu_aggregates(engine, start_ms, end_ms, hostname=hostname):
        if agg.n_samples:
            by_node[(agg.hostname, agg.simulated)].append(agg)
    rules = rules or default_rules()
    reports = []
    for (host, sim), aggs in sorted(by_node.items()):
        report = assess(host, sim, window_s, aggs, rules)
        if freshness:
            _judge_freshness(engine, report, aggs, end_ms, rules)
        reports.append(report)
    if freshness:
        reports = _with_clocks(engine, reports, window_s, hostname, end_ms, rules)
    if reports and (live_jobs if live_jobs is not None else any_live_job(engine, window_s, end_ms)):
        rows = set(job_checks(rules))
        for r in reports:
            r.verdicts = [v for v in r.verdicts if not (v.check in rows and v.status == NO_DATA)]
    return reports


def _judge_freshness(engine, report: BalanceReport, aggs, now_ms: int, rules: RuleSet) -> None:
    """Set the report's newest-sample age and the age past which it is stale: ``stale_after_intervals`` of the
    node's sampling interval (the mean spacing of its samples in the window; with one sample there, the gap to the
    one before), at least ``stale_min_s``. A node with a single sample ever is not judged."""
    from trimtab.store.queries import previous_sample_ms

    newest = max(aggs, key=lambda a: a.last_ts_ms or 0)
    if newest.last_ts_ms is None:
        return
    report.newest_sample_age_s = round(max(0, now_ms - newest.last_ts_ms) / 1000, 3)
    spacings = sorted((a.last_ts_ms - a.first_ts_ms) / (a.n_samples - 1) for a in aggs if a.n_samples >= 2)
    if spacings:
        interval_ms = spacings[len(spacings) // 2]
    else:
        before = previous_sample_ms(engine, newest.gpu_uuid, newest.last_ts_ms)
        if before is None:
            return
        interval_ms = newest.last_ts_ms - before
    ctl = rules.controller
    report.sample_interval_s = round(interval_ms / 1000, 3)
    # from the interval as reported, so the two figures a reader sees agree (5 × 1.001 s, not 5.003 s)
    report.stale_after_s = round(max(ctl.stale_after_intervals * report.sample_interval_s, ctl.stale_min_s), 3)


def _with_clocks(engine, reports: list[BalanceReport], window_s: float, hostname: Optional[str], now_ms: int,
                 rules: RuleSet) -> list[BalanceReport]:
    """Each report with its node's clock skew and what is wrong with it; plus a stale report, with no GPUs, for
    each node heard from lately (trimtab.store.clocks) that has no sample in the window: a node whose clock is
    behind, or whose batches are refused, is listed with why — not left out as if it did not exist."""
    from trimtab.store.clocks import NOTE_EVERY_MS, node_clocks_by_host, newest_sample_ms

    clocks = node_clocks_by_host(engine, hostname)
    for r in reports:
        clock = clocks.get(r.hostname)
        if clock is not None:
            r.clock_skew_s, r.clock_note = clock.clock_skew_s, clock.describe(now_ms) or None
    listed = {r.hostname for r in reports}
    lately_ms = now_ms - max(int(window_s * 1000), 2 * NOTE_EVERY_MS)  # heard_ms is refreshed once a minute
    for host, clock in sorted(clocks.items()):
        if host in listed or clock.heard_ms < lately_ms:
            continue
        newest = newest_sample_ms(engine, host)
        heard_s = max(0, now_ms - clock.heard_ms) / 1000
        note = (clock.describe(now_ms)
                or f"heard from {heard_s:.0f} s ago, but no sample of it lies in the last {window_s:g} s")
        reports.append(BalanceReport(
            hostname=host, simulated=clock.simulated, window_s=window_s, gpus=[],
            newest_sample_age_s=None if newest is None else round(max(0, now_ms - newest) / 1000, 3),
            stale_after_s=rules.controller.stale_min_s, clock_skew_s=clock.clock_skew_s, clock_note=note))
    return sorted(reports, key=lambda r: r.hostname)
