"""`trimtab check`: grade this node's (or every node's) balance over a window; exit 0 / 1 / 2.

Exit codes are the contract for scripts: 0 balanced (possibly with rows to watch), 1 out of balance (a check
crossed its "act" threshold), 2 could not tell (store unreachable, no samples in the window, a node whose newest
sample is stale — older than a few of its sampling intervals, rules.toml's ``stale_after_intervals`` — bad
arguments).
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import click

from trimtab.cli.end_state_read import each_stored_job, end_states_from_server, end_states_from_store
from trimtab.cli.options import configured_rules, db_option, env_option, simulate_options
from trimtab.paths import default_db_url

EXIT_OK, EXIT_IMBALANCE, EXIT_ERROR = 0, 1, 2
GPU_TIME_MIN_WINDOW_S = 600.0  # a job's GPU-time ledger is read over at least this long (as its job section)


class CheckError(Exception):
    """Why check could not produce a verdict."""


def _load_rules(rules_file):
    """The rules the daemon grades jobs by: the shipped file, --rules-file, then trimtab.toml's tables."""
    from trimtab.grading.rules_parse import RulesError

    try:
        return configured_rules(rules_file)
    except RulesError as exc:
        raise CheckError(f"rules rejected: {exc}") from exc


def _from_store(db_url: str, window_s: float, node, rules=None, jobs: bool = True):
    """(node reports, job summaries) from the store. Job sections replace the nodes' "no job data" rows."""
    from sqlalchemy.exc import SQLAlchemyError

    from trimtab.grading.job_report import live_job_summaries
    from trimtab.grading.node_report import node_reports
    from trimtab.store.engine import open_engine
    from trimtab.store.errors import StoreError, mask_url
    from trimtab.store.migrate import has_schema

    if db_url.startswith("sqlite:///") and not Path(db_url[len("sqlite:///"):]).exists():
        raise CheckError(f"no store at {db_url[len('sqlite:///'):]}: start `trimtab agent` (or `trimtab up`) first, "
                         f"or point --db at the store the agent writes to")
    try:
        engine = open_engine(db_url)
        try:
            if not has_schema(engine):
                raise CheckError(f"no trimtab tables in {mask_url(db_url)} yet: run `trimtab agent`, `trimtab up` or "
                                 f"`trimtab server` with this --db once (they create them), then check again")
            now_ms = int(time.time() * 1000)
            summaries = live_job_summaries(engine, window_s, rules, hostname=node, now_ms=now_ms) if jobs else []
            reports = node_reports(engine, window_s, hostname=node, now_ms=now_ms, live_jobs=bool(summaries),
                                   rules=rules)
        finally:
            engine.dispose()
    except StoreError as exc:
        raise CheckError(str(exc)) from exc
    except SQLAlchemyError as exc:
        raise CheckError(f"cannot read the store {mask_url(db_url)}: {' '.join(str(exc).split())[:300]}") from exc
    if not reports:
        who = f"node {node!r}" if node else "any node"
        _jobs_only(f"no samples from {who} in the last {window_s:g} s in {mask_url(db_url)}: is `trimtab agent` "
                   f"running?", summaries)
    return reports, summaries


def _gpu_time_from_store(db_url: str, window_s: float, names) -> dict:
    """Job name → its GPU-time ledger's totals and largest wastes over the last ``window_s`` seconds."""
    from trimtab.grading.ledger.read import job_ledger

    def read(engine, job, end):
        ledger = job_ledger(engine, job, end - int(window_s * 1000), end)
        rows = [(f"{h}:{g}", k, r, n, w, v) for (h, g, k, r, n, w), v in ledger.totals().items()]
        return _gpu_time(window_s, len(ledger.gpus), ledger.busy_gpu_s, ledger.idle_gpu_s, rows)

    return each_stored_job(db_url, names, read)


def _gpu_time_from_server(server_url: str, window_s: float, names) -> dict:
    """The same from a running server's GET /v1/jobs/{name}/gpu-time (a server without the route: none)."""
    out = {}
    for name in names:
        resp = _get(f"{server_url.rstrip('/')}/v1/jobs/{name}/gpu-time", {"window": f"{window_s:g}s"})
        if resp.status_code != 200:
            continue
        body = resp.json()
        rows = [(f"{t['hostname']}:{t['gpu']}", t["kind"], t["role"], t["phase"] or t["cause"], t["waiting_for"] or "",
                 t["gpu_s"]) for t in body["totals"]]
        out[name] = _gpu_time(window_s, len(body["gpus"]), body["busy_gpu_s"], body["idle_gpu_s"], rows)
    return out


def _gpu_time(window_s: float, n_gpus: int, busy_gpu_s: float, idle_gpu_s: float, rows) -> dict:
    from trimtab.grading.ledger.wastes import largest_wastes

    return {"window_s": window_s, "gpus": n_gpus, "busy_gpu_s": busy_gpu_s, "idle_gpu_s": idle_gpu_s,
            "wall_gpu_s": busy_gpu_s + idle_gpu_s, "wastes": [w.to_dict() for w in largest_wastes(rows)]}


def _with_gpu_time(section: str, g, end_state=None) -> str:
    """A job's section with its GPU time and its end state inserted before its verdict line (its last)."""
    from trimtab.grading.end_state import render

    text = "\n".join(([_render_gpu_time(g)] if g else []) + ([render(end_state)] if end_state else []))
    if not text:
        return section
    body, _, verdict = section.rstrip("\n").rpartition("\n")
    return f"{body}\n{text}\n{verdict}" if body else f"{text}\n{verdict}"


def _render_gpu_time(g: dict) -> str:
    wall = g["wall_gpu_s"] or 1.0
    lines = [f"GPU time over the last {g['window_s']:g} s on {g['gpus']} GPUs: "
             f"{g['wall_gpu_s'] / 3600:.3f} GPU-h, busy {100 * g['busy_gpu_s'] / wall:.0f} %, "
             f"idle {100 * g['idle_gpu_s'] / wall:.0f} %; largest wastes:"]
    for i, w in enumerate(g["wastes"], 1):
        lines.append(f"  {i}. {w['gpu_hours']:.3f} GPU-h  {w['what']} (GPU {', '.join(w['gpus'])})\n"
                     f"     → {w['action']}")
    return "\n".join(lines)


def _jobs_only(message: str, summaries) -> None:
    """No node samples: an error, unless jobs reported (then say so and show the jobs)."""
    if not summaries:
        raise CheckError(message)
    click.echo(f"trimtab check: {message} (showing the jobs only)", err=True)


def _reports_from_store(db_url: str, window_s: float, node, rules=None):
    return _from_store(db_url, window_s, node, rules, jobs=False)[0]


def _get(url: str, params: dict):
    import httpx

    try:
        return httpx.get(url, params=params, timeout=15.0)
    except httpx.HTTPError as exc:
        raise CheckError(f"cannot reach {url}: {exc}") from exc


def _from_server(server_url: str, window_s: float, node):
    """The same from a running `trimtab up`/`trimtab server`: GET /v1/balance (nodes) and GET /v1/balance/jobs
    (jobs; a server without that route has no job sections)."""
    from trimtab.grading.balance import BalanceReport
    from trimtab.grading.grading import job_checks
    from trimtab.grading.job_report import JobSummary
    from trimtab.grading.rules import default_rules

    params = {"window_s": window_s, **({"node": node} if node else {})}
    url = server_url.rstrip("/") + "/v1/balance"
    resp = _get(url, params)
    if resp.status_code != 200:
        raise CheckError(f"{url} answered HTTP {resp.status_code}: {resp.text[:300]}")
    try:
        reports = [BalanceReport.from_dict(r) for r in resp.json()["reports"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckError(f"{url} answered something that is not a balance report: {exc}") from exc
    summaries = []
    jobs_resp = _get(url + "/jobs", params)
    if jobs_resp.status_code == 200:
        try:
            summaries = [JobSummary.from_dict(j) for j in jobs_resp.json()["jobs"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckError(f"{url}/jobs answered something that is not a list of jobs: {exc}") from exc
    elif jobs_resp.status_code != 404:
        raise CheckError(f"{url}/jobs answered HTTP {jobs_resp.status_code}: {jobs_resp.text[:300]}")
    if summaries:  # the server's node reports drop them too; an older server's may not
        rows = set(job_checks(default_rules()))
        for r in reports:
            r.verdicts = [v for v in r.verdicts if not (v.check in rows and v.status == "no_data")]
    if not reports:
        who = f"node {node!r}" if node else "any node"
        _jobs_only(f"the server has no samples from {who} in the last {window_s:g} s", summaries)
    return reports, summaries


def _reports_live(window_s: float, interval_s: float, simulate, scenario, seed, node, rules):
    from trimtab.agent.runner import Agent, SourceUnavailable, make_sources
    from trimtab.store.sink import StoreSink

    from trimtab.agent.nvml import NO_DRIVER_HINT

    try:
        sources = make_sources(simulate=simulate, scenario=scenario, seed=seed, hostname=node)
    except SourceUnavailable as exc:
        raise CheckError(str(exc).replace(NO_DRIVER_HINT, "Run `trimtab check --simulate N` to grade a simulated "
                                          "node of N GPUs on a machine without NVIDIA GPUs.")) from exc
    with tempfile.TemporaryDirectory(prefix="trimtab-check-") as tmp:
        url = f"sqlite:///{tmp}/live.db"
        runner = Agent(sources, StoreSink(url), Path(tmp) / "spool", interval_s=interval_s, hostname=node,
                       status_every_s=max(window_s, 1.0))
        click.echo(f"sampling {len(runner.sampler.gpus)} GPUs live for {window_s:g} s …", err=True)
        runner.run(threading.Event(), duration_s=window_s)
        # The live window ends now; widen the read by one interval so the first tick is inside it. The samples
        # still span the window_s seconds sampled, and the report says so.
        reports = _reports_from_store(url, window_s + interval_s + 1, runner.node.hostname, rules)
        for r in reports:
            r.window_s = window_s
        return reports


@click.command()
@db_option
@env_option("--window", type=click.FloatRange(1, 90 * 86400), default=30.0, show_default=True, metavar="SECONDS",
            help="Grade the means of the last SECONDS of samples.")
@env_option("--node", default=None, help="Only this node (host name as the agent stored it); default: every node with samples in the window.")
@click.option("--live", is_flag=True, help="Sample this node now for --window seconds instead of reading the store.")
@env_option("--server", "server_url", default=None, metavar="URL",
            help="Ask a running `trimtab up`/`trimtab server` at URL (GET /v1/balance) instead of reading the store.")
@env_option("--rules-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
            help="Grade by this rules file (rules.toml's format; only the keys it names change: the node checks' and "
                 "the jobs' thresholds; a table naming its scope is a rule of its own, graded as a row too), as the "
                 "daemon's --rules-file; trimtab.toml's [controller] and [rules.<name>] "
                 "apply on top. Refused with --server: the server grades by the rules it was started with.")
@simulate_options
@env_option("--interval", type=click.FloatRange(0.05, 60), default=1.0, show_default=True, metavar="SECONDS",
            help="Sampling period with --live.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def check(db_url, window, node, live, server_url, rules_file, simulate, scenario, seed, interval, as_json):
    """Print the balance report and exit 0 balanced, 1 out of balance, 2 error (a stale node included: its newest
    sample older than stale_after_intervals of its sampling intervals, rules.toml).

    Per GPU: utilization, SM activity, memory %, PCIe GB/s and % of link peak, NVLink. Verdicts: utilization
    spread (act > 40 pts), PCIe (act > 90 % of peak), memory (act > 98 %). Then one section per job that reported
    through the trainer hook within the window (at least the last 10 minutes): its mode, knobs (or why it declares
    none), throughput and tokens/s, an RL trainer's completions, completion length and reward, why its step times
    alternate when only some steps generate, the rows step composition (on GPU time where the hook's CUDA events
    time the phases, else wall time; the row says which), fragmentation and collective latency over its newest
    window of steps, what the rebalancer last said about it (the gate that held a rule at ACT, the window, the data
    it misses and the step at which it expects to decide; or, while its plans fail, the error: on the job's line)
    and its recent rebalancer decisions. A job row at "act" counts as out of balance. Last, per job, where its GPU
    time went over the last max(--window, 600) s (the GPU-time ledger: busy and idle GPU-seconds) and its three
    largest wastes in GPU-hours, each with the action that addresses it; and its end state over its last
    end_state_window_s (rules.toml, 300 s shipped): each GPU's utilization against the 60–75 % band, the step time's
    variation (goal < 5 %), the scaling efficiency against the job's own steps at another GPU count in the store
    (unknown without them), and the word: at end state, not yet (which part misses) or unknown. The last line is
    the overall verdict, the one the exit code gives, naming the nodes and jobs that decided it.
    """
    jobs, gpu_time, end_states = [], {}, {}
    try:
        if server_url and rules_file and not (live or simulate):
            raise CheckError(f"--rules-file {rules_file} cannot apply with --server: the server grades by the rules it "
                             f"was started with (start it with --rules-file), or read the store here with --db")
        if live or simulate:
            reports = _reports_live(window, interval, simulate, scenario, seed, node, _load_rules(rules_file))
        elif server_url:
            reports, jobs = _from_server(server_url, window, node)
            gpu_time = _gpu_time_from_server(server_url, max(window, GPU_TIME_MIN_WINDOW_S), [j.name for j in jobs])
            end_states = end_states_from_server(server_url, [j.name for j in jobs], _get)
        else:
            rules = _load_rules(rules_file)
            reports, jobs = _from_store(db_url or default_db_url(), window, node, rules)
            gpu_time = _gpu_time_from_store(db_url or default_db_url(), max(window, GPU_TIME_MIN_WINDOW_S),
                                            [j.name for j in jobs])
            end_states = end_states_from_store(db_url or default_db_url(), [j.name for j in jobs], rules)
    except CheckError as exc:
        if as_json:
            click.echo(json.dumps({"status": "error", "error": str(exc)}))
        click.echo(f"trimtab check: {exc}", err=True)
        sys.exit(EXIT_ERROR)

    statuses = [r.status for r in reports] + [j.status for j in jobs]
    stale = [r for r in reports if r.stale]
    balanced = "act" not in statuses and not stale
    exit_code = EXIT_ERROR if stale else EXIT_OK if balanced else EXIT_IMBALANCE
    if as_json:
        status = "stale" if stale else "act" if "act" in statuses else ("watch" if "watch" in statuses else "ok")
        click.echo(json.dumps({"status": status, "balanced": balanced, "window_s": window,
                               "generated_at_ms": int(time.time() * 1000),
                               "simulated": any(r.simulated for r in reports) or any(j.simulated for j in jobs),
                               "nodes": [r.to_dict() for r in reports],
                               "jobs": [j.to_dict() for j in jobs], "gpu_time": gpu_time,
                               "end_state": end_states}, indent=2))
    else:
        from trimtab.cli.render import render_job, render_overall, render_report

        click.echo("\n\n".join([render_report(r) for r in reports]
                                 + [_with_gpu_time(render_job(j), gpu_time.get(j.name), end_states.get(j.name))
                                    for j in jobs] + [render_overall(reports, jobs, exit_code)]))
    for r in stale:
        click.echo(f"trimtab check: {r.staleness()}", err=True)
    for j in jobs:
        if (j.planner or {}).get("failing"):
            err = j.planner.get("last_error") or {}
            click.echo(f"trimtab check: the planner fails on job {j.name!r}: {err.get('type')}: {err.get('message')} "
                       f"(GET /v1/jobs/{j.name} has its events)", err=True)
    for r in reports:
        if r.clock_note and not r.stale:  # graded, but its samples sit off by its skew
            click.echo(f"trimtab check: node {r.hostname}: {r.clock_note}", err=True)
    sys.exit(exit_code)
