"""`trimtab up` (this node: agent + API on embedded SQLite) and `trimtab server` (a head node for many agents)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import click

from trimtab.cli.agent_cmd import exit_if_failed, install_stop_handlers, parse_gpu_list, report_failure
from trimtab.cli.options import (agent_options, configured_rules, db_option, env_option, interval_option,
                                  misconfigured, simulate_options)
from trimtab.paths import default_db_url, default_spool_dir, state_dir

log = logging.getLogger("trimtab.daemon")
DEFAULT_PORT = 9460


def api_options(f):
    f = env_option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
                   help="API port (0: any free port).")(f)
    f = env_option("--host", default="127.0.0.1", show_default=True,
                   help="Address the API binds. Anything but loopback needs API tokens to exist (see `trimtab token`).")(f)
    f = env_option("--metrics-nvlink-links/--no-metrics-nvlink-links", envvar="TRIMTAB_METRICS_NVLINK_LINKS",
                   default=False, show_default=True,
                   help="Per-link NVLink series on /metrics (trimtab_gpu_nvlink_link_*: 18 links x 3 families a GPU on "
                        "H100, ~70 % of a scrape's lines). Off, /metrics has per-GPU NVLink totals only, as "
                        "dcgm-exporter's default collectors; a scrape may still ask for them with ?nvlink_links=true.")(f)
    f = env_option("--metrics-dcgm-names", envvar="TRIMTAB_METRICS_DCGM_NAMES",
                   type=click.Choice(["current", "legacy"]), default="current", show_default=True,
                   help="Which dcgm-exporter generation /metrics names its DCGM series after: current (4.10's "
                        "names and units: utilization as a 0-1 ratio, memory in bytes, clock in Hz, PCIe/NVLink "
                        "*_BYTES_PER_SECOND, label hostname) or legacy (exporters up to 4.8.2: DCGM_FI_DEV_GPU_UTIL "
                        "in %, FB in MiB, SM clock in MHz, label Hostname too).")(f)
    return f


def rebalancer_options(f):
    f = env_option("--rebalance/--no-rebalance", envvar="TRIMTAB_REBALANCE", default=True, show_default=True,
                   help="Run the rebalancer (jobs in mode auto get knob changes, jobs in advise get decisions).")(f)
    f = env_option("--rules-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                   help="A rules file in rules.toml's format; only the keys it names change. trimtab.toml's "
                        "[controller] and [rules.<name>] tables apply on top.")(f)
    return f


def _load_rules(rules_file):
    """The rules, loaded before anything starts: a file that cannot be read or parsed, or a value it may not hold,
    stops start-up with the file, line and reason, exit 78 (waiting cannot fix it: no restart loop under systemd)."""
    from trimtab.grading.rules_parse import RulesError

    try:
        return configured_rules(rules_file)
    except RulesError as exc:
        raise misconfigured(f"rules rejected: {exc}") from None


def _start_rebalancer(ctx, rules, enabled: bool):
    """Give the API the rules (:func:`_load_rules`) and start the rebalancer. It plans only while this process holds
    the store's planner lease (control/leadership.py: several servers on one PostgreSQL, one plans), taken by
    :func:`_lead` once the API listens."""
    from trimtab.control.leadership import Leadership
    from trimtab.control.service import Rebalancer

    ctx.rules = rules
    if not enabled:
        return None
    rebalancer = Rebalancer(ctx.engine, ctx.rules, leadership=Leadership(ctx.engine))
    rebalancer.start(own_process=True)  # plans off the API's interpreter lock
    ctx.planner_status = rebalancer.leadership.status
    ctx.after_report = rebalancer.after_report
    ctx.after_refusal = rebalancer.after_refusal
    return rebalancer


def _shut_down(notifier, api, rebalancer, engine) -> None:
    """Say STOPPING, stop serving, stop deciding, close the store — in that order, for up and server alike."""
    from trimtab.store.engine import release_engine

    import gc

    notifier.stopping()
    api.stop()
    if api.ledger is not None:
        api.ledger.stop()
    if rebalancer is not None:
        rebalancer.stop()
    release_engine(engine)
    gc.unfreeze()  # what settle_heap froze at start is the collector's again (`up` run inside another program)


def _open_store(url: str):
    """The process's engine on the store at ``url``, migrated (the agent's store sink in `up` shares it)."""
    from trimtab.store.engine import release_engine, shared_engine
    from trimtab.store.errors import StoreError
    from trimtab.store.migrate import migrate

    engine = None
    try:
        engine = shared_engine(url)
        migrate(engine)
    except StoreError as exc:
        if engine is not None:
            release_engine(engine)
        # A permanent refusal is not an outage: systemd must not restart this in a loop.
        raise (misconfigured(str(exc)) if exc.permanent else click.ClickException(str(exc))) from exc
    return engine


def _guard_bind(engine, host: str, sd: Path) -> None:
    """Refuse to expose an API without tokens; on loopback create the first admin token and say where it is."""
    from trimtab.api.auth import TokenFileConflict, any_tokens, ensure_admin_token
    from trimtab.daemon import is_loopback

    if not is_loopback(host) and not any_tokens(engine):
        raise click.ClickException(
            f"refusing to listen on {host}: no API token exists, so anyone who can reach this address could write. "
            f"Create one first (`trimtab token create --name admin --scope admin`) or bind 127.0.0.1.")
    try:
        path = ensure_admin_token(engine, sd)
    except TokenFileConflict as exc:
        raise click.ClickException(str(exc)) from None
    if path is not None:
        click.echo(f"created the first admin API token in {path} (mode 0600); agents and jobs need tokens of their own "
                   f"(`trimtab token create --name agents --scope agent`, `trimtab token create --name my-job "
                   f"--scope job --out job.token` for a training job)", err=True)


def _lead(rebalancer, host: str, port: int) -> None:
    """Take the planner's lease (or follow the server that holds it), naming this server by where it answers."""
    import socket

    if rebalancer is not None and rebalancer.leadership is not None:
        rebalancer.leadership.start(label=f"{socket.gethostname()} {host}:{port}")


def _serve(ctx, host: str, port: int):
    """The API, listening, and the GPU-time ledger's ticker (/metrics' ledger counters advance on it, not on a
    scrape)."""
    from trimtab.api.app import create_app
    from trimtab.daemon import ApiServer, DaemonError, settle_heap
    from trimtab.grading.ledger.ticker import LedgerTicker

    try:
        api = ApiServer(create_app(ctx), host, port).start()
    except DaemonError as exc:
        raise click.ClickException(str(exc)) from exc
    settle_heap()  # after start-up, before the first request: full collections stop every request for less
    api.ledger = LedgerTicker(ctx.engine).start()
    parts = ctx.component_status
    ctx.component_status = lambda: {**parts(), "ledger": api.ledger.health()}
    return api


@click.command()
@db_option
@api_options
@interval_option
@simulate_options
@agent_options
@rebalancer_options
def up(db_url, host, port, metrics_nvlink_links, metrics_dcgm_names, interval, simulate, scenario, seed, gpus, hostname, spool_dir, spool_max_mb, status_every,
       duration, rules_file, rebalance):
    """Run this node's daemon: the agent, the REST API and /metrics in one process, on embedded SQLite.

    Uses NVML when an NVIDIA driver is present; otherwise starts a simulated node of 4 GPUs (or --simulate N),
    says so at start-up, and marks its data "simulated" in every response.
    """
    from trimtab.agent.runner import Agent, SourceUnavailable, make_sources
    from trimtab.api.context import ApiContext
    from trimtab.store.sink import StoreSink
    from trimtab.daemon import StatusPinger
    from trimtab.sdnotify import Notifier

    rules = _load_rules(rules_file)  # before anything starts: a bad file leaves no store, token or sample behind
    url = db_url or default_db_url()
    sd = state_dir()
    engine = _open_store(url)
    _guard_bind(engine, host, sd)
    try:
        sources = make_sources(simulate=simulate, scenario=scenario, seed=seed, gpu_indices=parse_gpu_list(gpus),
                               fallback_gpus=4, hostname=hostname)
    except (SourceUnavailable, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    ctx = ApiContext(engine=engine, mode="up", state_dir=sd, metrics_nvlink_links=metrics_nvlink_links,
                     metrics_dcgm_names=metrics_dcgm_names)
    runner = Agent(sources, StoreSink(url), spool_dir or default_spool_dir(), interval_s=interval, hostname=hostname,
                   status_every_s=status_every, spool_max_bytes=spool_max_mb * 1024 * 1024, on_batch=ctx.snapshot.update_sampled)
    rebalancer = _start_rebalancer(ctx, rules, rebalance)
    ctx.component_status = lambda: {"agent": runner.health(),
                                    "rebalancer": rebalancer.health() if rebalancer else {"state": "disabled"}}
    api = _serve(ctx, host, port)
    _lead(rebalancer, host, api.port)
    notifier = Notifier()
    stop = threading.Event()
    install_stop_handlers(stop, on_stop=notifier.stopping)
    sim = "  *** SIMULATED node: no NVIDIA driver found, readings are synthetic ***" if runner.node.simulated else ""
    click.echo(f"{runner.banner()}\nAPI on http://{host}:{api.port} (docs: /docs, metrics: /metrics){sim}", err=True)
    notifier.ready(f"up: {len(runner.sampler.gpus)} GPUs, API {host}:{api.port}")
    status = (lambda: f"{runner.status_line()}; {rebalancer.status_line()}") if rebalancer else runner.status_line
    pinger = StatusPinger(notifier, status, every_s=status_every, log_it=False)
    try:
        runner.run(stop, duration_s=duration, on_tick=pinger)
        report_failure(runner, notifier)
    finally:
        _shut_down(notifier, api, rebalancer, engine)
    exit_if_failed(runner)


@click.command()
@db_option
@api_options
@env_option("--status-every", type=click.FloatRange(0.1, 86400), default=10.0, show_default=True, metavar="SECONDS",
            help="Period of the one-line status log.")
@env_option("--duration", type=click.FloatRange(0, None, min_open=True), default=None, metavar="SECONDS",
            help="Stop after this long (default: run until SIGINT/SIGTERM).")
@rebalancer_options
def server(db_url, host, port, metrics_nvlink_links, metrics_dcgm_names, status_every, duration, rules_file, rebalance):
    """Run a head node: the REST API, /metrics and ingest for remote agents (`trimtab agent --server URL`).

    Give it the shared store with --db postgresql+psycopg://… . Agents may also write to that PostgreSQL
    directly (`trimtab agent --db …`); the server then serves their data too. The server runs the store's
    rollups and retention. Several servers may share one PostgreSQL: all serve ingest and reads, exactly one plans
    (the holder of the store's planner lease; GET /v1/planner names it), another takes over within seconds of its
    death. On SQLite a second server serves without planning.
    """
    import time

    from trimtab.api.context import ApiContext
    from trimtab.daemon import StatusPinger, wait_loop
    from trimtab.sdnotify import Notifier
    from trimtab.store.errors import mask_url
    from trimtab.store.rollup import Upkeep

    rules = _load_rules(rules_file)
    url = db_url or default_db_url()
    sd = state_dir()
    engine = _open_store(url)
    _guard_bind(engine, host, sd)
    ctx = ApiContext(engine=engine, mode="server", state_dir=sd, metrics_nvlink_links=metrics_nvlink_links,
                     metrics_dcgm_names=metrics_dcgm_names)
    rebalancer = _start_rebalancer(ctx, rules, rebalance)
    ctx.component_status = lambda: {"rebalancer": rebalancer.health() if rebalancer else {"state": "disabled"}}
    api = _serve(ctx, host, port)
    _lead(rebalancer, host, api.port)
    notifier = Notifier()
    stop = threading.Event()
    install_stop_handlers(stop, on_stop=notifier.stopping)
    click.echo(f"trimtab server: API on http://{host}:{api.port} (docs: /docs, metrics: /metrics), store {mask_url(url)}",
               err=True)
    notifier.ready(f"server: API {host}:{api.port}")
    upkeep = Upkeep()  # the server owns its store's rollups and retention

    def line() -> str:
        nodes = ctx.snapshot.nodes()
        line = f"server {host}:{api.port}: {len(nodes)} nodes shipping, {sum(len(n.samples) for n in nodes)} GPUs"
        return f"{line}; {rebalancer.status_line()}" if rebalancer else line

    pinger = StatusPinger(notifier, line, every_s=status_every)
    started = time.monotonic()

    def tick() -> None:
        pinger()
        upkeep.maybe_run(engine)
        if duration is not None and time.monotonic() - started >= duration:
            stop.set()

    try:
        wait_loop(stop, tick, period_s=min(1.0, status_every), alive=lambda: api.alive)
    finally:
        _shut_down(notifier, api, rebalancer, engine)
